/*
 * cov_exit.c — linked into the unit tests of the coverage build only
 * (mk/coverage.mk, with -Wl,--wrap=_exit,--wrap=_Exit): a process ending in
 * _exit() or _Exit() writes its gcov counters first. libgcov writes them at
 * exit() and before an exec, not at _exit(), which is how the forked
 * children of the tests and of the sandbox and kernel code end; without
 * this, the lines only they run would count as not executed. A child that
 * cannot reach the .gcda files (another mount namespace, a filter that
 * denies open) still loses its counts: the figure is a lower bound.
 */
#include <stdnoreturn.h>

void __gcov_dump(void); /* libgcov */
noreturn void __real__exit(int status);
noreturn void __real__Exit(int status);
noreturn void __wrap__exit(int status);
noreturn void __wrap__Exit(int status);

noreturn void __wrap__exit(int status)
{
    __gcov_dump();
    __real__exit(status);
}

noreturn void __wrap__Exit(int status)
{
    __gcov_dump();
    __real__Exit(status);
}
