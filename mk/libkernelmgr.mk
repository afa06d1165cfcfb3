# libkernelmgr — the C client library (libkernelmgr/kernelmgr.h, docs/EMBEDDING.md).
# Included from the Makefile. Builds, with `make`:
#   build/lib/libkernelmgr.so.0.1.0 (soname libkernelmgr.so.0; links .so.0 and .so),
#   build/lib/libkernelmgr.a, build/lib/kernelmgr.pc (for PREFIX) and
#   build/lib/kernelmgr-uninstalled.pc (the build tree: PKG_CONFIG_PATH=build/lib),
#   build/examples/code_exec (examples/c/code_exec.c against the shared library).
# `make install-lib` / `make uninstall-lib` honour DESTDIR, PREFIX, LIBDIR, INCLUDEDIR;
# install-lib is in INSTALL_EXTRA (`make install` depends on it).
#
# Objects are built apart (build/lib/obj), position-independent and with
# -fvisibility=hidden; the version script exports kernelmgr_* only. The
# library reuses the home's trust check (kmhome.c, kmfs.c, kmerr.c: libc only) and
# reimplements the small socket client (DESIGN.md "libkernelmgr").

# Included once however the Makefile includes it (by name, or with every
# mk/*.mk before the install rules, whose prerequisites read INSTALL_EXTRA).
ifndef KLIB_MK_INCLUDED
KLIB_MK_INCLUDED := 1

PREFIX     ?= /usr/local
BINDIR     ?= $(PREFIX)/bin
LIBDIR     ?= $(PREFIX)/lib
INCLUDEDIR ?= $(PREFIX)/include

KLIB_VERSION := 0.1.0
KLIB_SONAME  := libkernelmgr.so.0
KLIB_DIR     := $(BUILD)/lib
KLIB_SO      := $(KLIB_DIR)/libkernelmgr.so.$(KLIB_VERSION)
KLIB_A       := $(KLIB_DIR)/libkernelmgr.a
KLIB_PC      := $(KLIB_DIR)/kernelmgr.pc
KLIB_PC_UN   := $(KLIB_DIR)/kernelmgr-uninstalled.pc
KLIB_SRC     := $(wildcard libkernelmgr/*.c) kernelmgr/engine/kmhome.c kernelmgr/engine/kmfs.c \
                kernelmgr/engine/kmerr.c
KLIB_OBJ     := $(KLIB_SRC:%.c=$(KLIB_DIR)/obj/%.o)
KLIB_HDR     := $(wildcard libkernelmgr/*.h) kernelmgr/engine/kmhome.h kernelmgr/engine/kmfs.h \
                kernelmgr/engine/kmerr.h
KLIB_CFLAGS   = $(ALL_CFLAGS) $(CPPFLAGS) -fPIC -fvisibility=hidden
KLIB_LIBS     = $(shell pkg-config --libs jansson) -lpthread
KLIB_EXAMPLE := $(BUILD)/examples/code_exec

# The daemon binary the library starts by default is BINDIR/kernelmgr of
# the build, and kernelmgr.pc names PREFIX, LIBDIR and INCLUDEDIR: a stamp
# holding them rebuilds klib_home.o and kernelmgr.pc when one changes.
KLIB_STAMP := $(KLIB_DIR)/.dirs
KLIB_DIRS  := $(BINDIR) $(PREFIX) $(LIBDIR) $(INCLUDEDIR)
$(shell mkdir -p $(KLIB_DIR) && { echo '$(KLIB_DIRS)' | cmp -s - $(KLIB_STAMP) || echo '$(KLIB_DIRS)' >$(KLIB_STAMP); })
# clang's sanitizers leave their runtime to the executable
KLIB_NOUNDEF = $(if $(findstring -fsanitize,$(CFLAGS)),,-Wl,--no-undefined)

.PHONY: libkernelmgr install-lib uninstall-lib
all: libkernelmgr
libkernelmgr: $(KLIB_SO) $(KLIB_DIR)/$(KLIB_SONAME) $(KLIB_DIR)/libkernelmgr.so $(KLIB_A) \
  $(KLIB_PC) $(KLIB_PC_UN) $(KLIB_EXAMPLE)
INSTALL_EXTRA += install-lib
UNINSTALL_EXTRA += uninstall-lib
FMT_FILES += $(wildcard libkernelmgr/*.[ch] examples/c/*.c tests/e2e/clib/*.c)
# The Rust client (clients/rust) builds with Debian's cargo, offline;
# tests/e2e/test_client_rust.py runs its tests where cargo is installed.
DEB_PACKAGES += cargo

$(KLIB_DIR)/obj/%.o: %.c $(KLIB_HDR)
	@mkdir -p $(dir $@)
	$(CC) $(KLIB_CFLAGS) -c $< -o $@
$(KLIB_DIR)/obj/libkernelmgr/klib_home.o: $(KLIB_STAMP)
$(KLIB_DIR)/obj/libkernelmgr/klib_home.o: KLIB_CFLAGS += -DKLIB_BINDIR='"$(BINDIR)"'

$(KLIB_SO): $(KLIB_OBJ) libkernelmgr/libkernelmgr.map
	$(CC) $(CFLAGS) $(LDFLAGS) -shared -Wl,-soname,$(KLIB_SONAME) \
	  -Wl,--version-script=libkernelmgr/libkernelmgr.map $(KLIB_NOUNDEF) \
	  -o $@ $(KLIB_OBJ) $(KLIB_LIBS)
$(KLIB_DIR)/$(KLIB_SONAME): $(KLIB_SO)
	ln -sf $(notdir $<) $@
$(KLIB_DIR)/libkernelmgr.so: $(KLIB_DIR)/$(KLIB_SONAME)
	ln -sf $(notdir $<) $@
$(KLIB_A): $(KLIB_OBJ)
	rm -f $@ && ar rcs $@ $^

# kernelmgr.pc for the installed files; kernelmgr-uninstalled.pc for the
# build tree (pkg-config prefers it when it is on PKG_CONFIG_PATH).
KLIB_PC_SED = sed -e 's|@VERSION@|$(KLIB_VERSION)|'
$(KLIB_PC): libkernelmgr/kernelmgr.pc.in $(KLIB_STAMP)
	$(KLIB_PC_SED) -e 's|@PREFIX@|$(PREFIX)|' -e 's|@LIBDIR@|$(LIBDIR)|' \
	  -e 's|@INCLUDEDIR@|$(INCLUDEDIR)|' $< >$@
$(KLIB_PC_UN): libkernelmgr/kernelmgr.pc.in
	$(KLIB_PC_SED) -e "s|@PREFIX@|$(CURDIR)|" -e "s|@LIBDIR@|$(abspath $(KLIB_DIR))|" \
	  -e "s|@INCLUDEDIR@|$(CURDIR)/libkernelmgr|" $< >$@

$(KLIB_EXAMPLE): examples/c/code_exec.c libkernelmgr/kernelmgr.h $(KLIB_DIR)/libkernelmgr.so
	@mkdir -p $(dir $@)
	$(CC) -std=gnu11 $(WARN) $(CFLAGS) $(CPPFLAGS) -Ilibkernelmgr -o $@ $< -L$(KLIB_DIR) -lkernelmgr \
	  -Wl,-rpath,'$$ORIGIN/../lib' $(LDFLAGS)

# The unit test links the static library (its internal functions too) and,
# after it, the manager's (kmcfg_home: the CLI's home, compared).
$(BUILD)/tests/test_klib: tests/unit/test_klib.c $(KLIB_A) $(ALL_LIBS) $(KLIB_HDR)
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) $(LDFLAGS) -o $@ $< $(KLIB_A) $(ALL_LIBS) -lcmocka $(LDLIBS)

install-lib: libkernelmgr
	install -d $(DESTDIR)$(LIBDIR)/pkgconfig $(DESTDIR)$(INCLUDEDIR)
	install -m 0644 $(KLIB_SO) $(KLIB_A) $(DESTDIR)$(LIBDIR)/
	ln -sf libkernelmgr.so.$(KLIB_VERSION) $(DESTDIR)$(LIBDIR)/$(KLIB_SONAME)
	ln -sf $(KLIB_SONAME) $(DESTDIR)$(LIBDIR)/libkernelmgr.so
	install -m 0644 libkernelmgr/kernelmgr.h $(DESTDIR)$(INCLUDEDIR)/kernelmgr.h
	$(KLIB_PC_SED) -e 's|@PREFIX@|$(PREFIX)|' -e 's|@LIBDIR@|$(LIBDIR)|' \
	  -e 's|@INCLUDEDIR@|$(INCLUDEDIR)|' libkernelmgr/kernelmgr.pc.in \
	  >$(DESTDIR)$(LIBDIR)/pkgconfig/kernelmgr.pc
uninstall-lib:
	rm -f $(DESTDIR)$(LIBDIR)/libkernelmgr.so.$(KLIB_VERSION) \
	  $(DESTDIR)$(LIBDIR)/$(KLIB_SONAME) $(DESTDIR)$(LIBDIR)/libkernelmgr.so \
	  $(DESTDIR)$(LIBDIR)/libkernelmgr.a $(DESTDIR)$(LIBDIR)/pkgconfig/kernelmgr.pc \
	  $(DESTDIR)$(INCLUDEDIR)/kernelmgr.h

endif
