/* kernelmgr — sessions of sandboxed Python and Bash kernels for agents. */
#include "kernelmgr/frontends/cli.h"

int main(int argc, char **argv)
{
    return cli_main(argc, argv);
}
