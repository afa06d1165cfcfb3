# mk/install.mk — make install / uninstall (included by the Makefile).
#
#   BINDIR/kernelmgr                          the command
#   LIBEXECDIR/kernelmgr/kernel-python, kernel-bash, kernelmgr-gateway, kernelmgr-sandbox
#                                             helpers: run by kernelmgr, not on PATH
#   DATADIR/kernelmgr/python/driver.py (+ __pycache__ for INSTALL_PYTHON),
#   DATADIR/kernelmgr/bash/*.sh               the kernels' support files
#   MANDIR/man1/kernelmgr.1, MANDIR/man5/kernelmgr.json.5
#   BASHCOMPDIR/kernelmgr                     bash completion
#   SYSTEMDSYSTEMUNITDIR/kernelmgr.service, SYSTEMDUSERUNITDIR/kernelmgr.service
#
# Everything goes under $(DESTDIR); `uninstall` removes exactly these (and
# the kernelmgr directories, which hold nothing else). Other fragments
# (mk/*.mk) add their steps to INSTALL_EXTRA / UNINSTALL_EXTRA.

# The interpreter the installed driver is precompiled for (checked-hash
# .pyc, see PYKERNEL_BOOT); the driver compiles at start for any other.
# "none": no bytecode installed (a package compiles it in its postinst).
INSTALL_PYTHON ?= $(PYTHON)
SYSTEMDSYSTEMUNITDIR ?= $(PREFIX)/lib/systemd/system
SYSTEMDUSERUNITDIR ?= $(PREFIX)/lib/systemd/user
INSTALL_SHARE := $(patsubst kernels/%,%,$(wildcard kernels/python/*.py kernels/bash/*.sh))
HELPERS := kernel-python kernel-bash kernelmgr-gateway kernelmgr-sandbox
MAN_PAGES := $(BUILD)/man/kernelmgr.1 $(BUILD)/man/kernelmgr.json.5
BASH_COMPLETION := $(BUILD)/completion/kernelmgr
GENERATED := $(MAN_PAGES) $(BASH_COMPLETION)
all: $(GENERATED)

# kernelmgr.json(5): the option list is `kernelmgr config --doc` (the same
# table as docs/CONFIGURATION.md), so the page cannot drift from the code.
$(BUILD)/man/kernelmgr.json.5: deploy/man/kernelmgr.json.5.in deploy/man/mdtable2man.sh $(BUILD)/kernelmgr
	@mkdir -p $(dir $@)
	$(BUILD)/kernelmgr config --doc | deploy/man/mdtable2man.sh deploy/man/kernelmgr.json.5.in >$@.tmp
	mv $@.tmp $@
$(BUILD)/man/kernelmgr.1: deploy/man/kernelmgr.1.in deploy/man/commands2man.sh $(BUILD)/kernelmgr
	@mkdir -p $(dir $@)
	$(BUILD)/kernelmgr --help | deploy/man/commands2man.sh deploy/man/kernelmgr.1.in >$@.tmp
	mv $@.tmp $@
# bash completion: the commands and options of `kernelmgr --help`.
$(BASH_COMPLETION): deploy/completion/gen-bash.sh $(BUILD)/kernelmgr
	@mkdir -p $(dir $@)
	$(BUILD)/kernelmgr --help | deploy/completion/gen-bash.sh >$@.tmp
	mv $@.tmp $@

install: all $(INSTALL_EXTRA)
	$(INSTALL) -d '$(DESTDIR)$(BINDIR)' '$(DESTDIR)$(LIBEXECDIR)/kernelmgr' \
	  '$(DESTDIR)$(DATADIR)/kernelmgr/python' '$(DESTDIR)$(DATADIR)/kernelmgr/bash' \
	  '$(DESTDIR)$(MANDIR)/man1' '$(DESTDIR)$(MANDIR)/man5' '$(DESTDIR)$(BASHCOMPDIR)' \
	  '$(DESTDIR)$(SYSTEMDSYSTEMUNITDIR)' '$(DESTDIR)$(SYSTEMDUSERUNITDIR)'
	$(INSTALL) -m 0755 $(BUILD)/kernelmgr '$(DESTDIR)$(BINDIR)/kernelmgr'
	$(INSTALL) -m 0755 $(addprefix $(BUILD)/,$(HELPERS)) '$(DESTDIR)$(LIBEXECDIR)/kernelmgr/'
	for f in $(INSTALL_SHARE); do \
	  $(INSTALL) -m 0644 kernels/$$f '$(DESTDIR)$(DATADIR)/kernelmgr/'$$f || exit 1; done
	@if [ '$(INSTALL_PYTHON)' = none ]; then :; elif command -v $(INSTALL_PYTHON) >/dev/null 2>&1; then \
	  echo "precompiling driver.py for $(INSTALL_PYTHON)"; \
	  $(INSTALL_PYTHON) -I -c 'import py_compile as p, sys; [p.compile(sys.argv[1], dfile=sys.argv[2], \
	    optimize=o, doraise=True, invalidation_mode=p.PycInvalidationMode.CHECKED_HASH) \
	    for o in (0, 1, 2)]' '$(DESTDIR)$(DATADIR)/kernelmgr/python/driver.py' \
	    '$(DATADIR)/kernelmgr/python/driver.py' && \
	  chmod -R go-w,a+rX '$(DESTDIR)$(DATADIR)/kernelmgr/python/__pycache__'; \
	else echo "note: $(INSTALL_PYTHON) not found: driver.py compiles at each start"; fi
	$(INSTALL) -m 0644 $(BUILD)/man/kernelmgr.1 '$(DESTDIR)$(MANDIR)/man1/kernelmgr.1'
	$(INSTALL) -m 0644 $(BUILD)/man/kernelmgr.json.5 '$(DESTDIR)$(MANDIR)/man5/kernelmgr.json.5'
	$(INSTALL) -m 0644 $(BASH_COMPLETION) '$(DESTDIR)$(BASHCOMPDIR)/kernelmgr'
	sed -e 's|@BINDIR@|$(BINDIR)|g' deploy/systemd/system/kernelmgr.service.in \
	  >'$(DESTDIR)$(SYSTEMDSYSTEMUNITDIR)/kernelmgr.service'
	sed -e 's|@BINDIR@|$(BINDIR)|g' deploy/systemd/user/kernelmgr.service.in \
	  >'$(DESTDIR)$(SYSTEMDUSERUNITDIR)/kernelmgr.service'
	chmod 0644 '$(DESTDIR)$(SYSTEMDSYSTEMUNITDIR)/kernelmgr.service' \
	  '$(DESTDIR)$(SYSTEMDUSERUNITDIR)/kernelmgr.service'

uninstall: $(UNINSTALL_EXTRA)
	rm -f '$(DESTDIR)$(BINDIR)/kernelmgr' '$(DESTDIR)$(MANDIR)/man1/kernelmgr.1' \
	  '$(DESTDIR)$(MANDIR)/man5/kernelmgr.json.5' '$(DESTDIR)$(BASHCOMPDIR)/kernelmgr' \
	  '$(DESTDIR)$(SYSTEMDSYSTEMUNITDIR)/kernelmgr.service' \
	  '$(DESTDIR)$(SYSTEMDUSERUNITDIR)/kernelmgr.service'
	for f in $(HELPERS); do rm -f '$(DESTDIR)$(LIBEXECDIR)/kernelmgr/'$$f; done
	for f in $(INSTALL_SHARE); do rm -f '$(DESTDIR)$(DATADIR)/kernelmgr/'$$f; done
	rm -rf '$(DESTDIR)$(DATADIR)/kernelmgr/python/__pycache__'
	-rmdir '$(DESTDIR)$(LIBEXECDIR)/kernelmgr' '$(DESTDIR)$(DATADIR)/kernelmgr/python' \
	  '$(DESTDIR)$(DATADIR)/kernelmgr/bash' '$(DESTDIR)$(DATADIR)/kernelmgr' 2>/dev/null; true

# The Debian package, built from the tree into ../ (debian/, docs/INSTALL.md).
deb:
	dpkg-buildpackage -us -uc -b

# The container image (deploy/container/Containerfile) from the .deb; needs
# podman. Not part of `make test`. CONTAINER_BASE: the Debian base image
# (`make container-base` makes one offline from the Debian archive).
CONTAINER_BASE ?= docker.io/library/debian:bookworm-slim
CONTAINER_TAG ?= kernelmgr:latest
# e.g. --isolation chroot where the OCI runtime cannot make containers
# (crun refuses hybrid cgroup hosts); the image is the same
CONTAINER_BUILD_FLAGS ?=
DEB_VERSION = $(shell dpkg-parsechangelog -S Version 2>/dev/null)
DEB_ARCH = $(shell dpkg --print-architecture 2>/dev/null)
container:
	@command -v podman >/dev/null || { echo "container: podman is not installed" >&2; exit 1; }
	$(MAKE) --no-print-directory deb
	cp ../kernelmgr_$(DEB_VERSION)_$(DEB_ARCH).deb deploy/container/kernelmgr.deb
	podman build $(CONTAINER_BUILD_FLAGS) --build-arg BASE=$(CONTAINER_BASE) -t $(CONTAINER_TAG) \
	  -f deploy/container/Containerfile deploy/container; \
	  rc=$$?; rm -f deploy/container/kernelmgr.deb; exit $$rc
container-base:
	@command -v debootstrap >/dev/null || { echo "container-base: debootstrap is not installed" >&2; exit 1; }
	rm -rf $(BUILD)/container-root
	debootstrap --variant=minbase bookworm $(BUILD)/container-root http://deb.debian.org/debian
	tar -C $(BUILD)/container-root -c . | podman import - localhost/kernelmgr-base:bookworm
	rm -rf $(BUILD)/container-root
	@echo "base image: make container CONTAINER_BASE=localhost/kernelmgr-base:bookworm"
