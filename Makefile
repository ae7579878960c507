SHELL := /bin/bash
# One static binary; tests run as root on a privileged runner.
GO        ?= go
BIN       := bin/hostpathplugin
CTL       := bin/hostpathctl
RUN_DIR   ?= $(CURDIR)/run
ENDPOINT  ?= unix://$(RUN_DIR)/csi.sock
STATE_DIR ?= $(RUN_DIR)/state
NODE_ID   ?= $(shell hostname)

export CGO_ENABLED = 0
# Every build and test without the machine's paths, so that the binaries
# the tests build, the image's and the cluster's share one compile of each
# package (a build with -trimpath and one without compile everything
# twice: about 3 minutes on a cold machine); and without VCS stamps, which
# need git to accept the checkout (it refuses one another user owns, as
# make test-unprivileged's nobody does) and which the image never carries.
# Set here, not left to the machine's go env: a fresh machine has none.
export GOFLAGS := $(strip $(filter-out -buildvcs=%,$(shell $(GO) env GOFLAGS 2>/dev/null)) -trimpath -buildvcs=false)

.PHONY: ci test-all test-kernel-sample test-powerloss-sample e2e-backup test-chart test-upgrade test-powerloss test-kernel kernel-deps unit-bin e2e-suite test-unprivileged cluster-deps cluster-build cluster-up cluster-down cluster-deploy image-previous e2e targets-smoke scale stress fuzz all build run demo test test-unit test-sanity test-distroless image bench bench-smoke lint deps clean

all: build

build:
	$(GO) build -o $(BIN) ./cmd/hostpathplugin
	$(GO) build -o $(CTL) ./cmd/hostpathctl

# Run the driver in the foreground on a local socket, state under ./run.
run: build
	mkdir -p $(RUN_DIR)
	$(BIN) --endpoint=$(ENDPOINT) --nodeid=$(NODE_ID) --statedir=$(STATE_DIR) -v=2

# Start a driver, create, publish, write, snapshot and clone a volume,
# print each step and its time, clean up.
demo: build
	mkdir -p $(RUN_DIR)/demo
	$(BIN) --endpoint=unix://$(RUN_DIR)/demo/csi.sock --nodeid=$(NODE_ID) --statedir=$(RUN_DIR)/demo/state -v=0 & pid=$$!; \
	  for i in $$(seq 600); do [ -S $(RUN_DIR)/demo/csi.sock ] && break; sleep 0.05; done; \
	  $(CTL) --endpoint=unix://$(RUN_DIR)/demo/csi.sock --dir=$(RUN_DIR)/demo info && \
	  $(CTL) --endpoint=unix://$(RUN_DIR)/demo/csi.sock --dir=$(RUN_DIR)/demo demo; rc=$$?; \
	  kill $$pid; wait $$pid; exit $$rc

# Every test: unit tests with the race detector, csi-sanity against the
# real binary for mount (directory and image layouts) and block volumes,
# and the rest below. The race-built test binaries are linked once
# (unit-bin), then two lanes run side by side, since test-unit alone keeps
# about 1.5 of this runner's 2 cores busy (253 s user and 140 s system in
# 252 s): the second lane holds what attaches and mounts little (the
# chart, the upgrade, the tests as nobody, fuzzing), and its output is
# printed when both are done. targets-smoke, whose benchmarks attach and
# mount as much as test-unit, runs after them: beside test-unit, the two
# lanes' loop devices and mounts made tests fail that pass alone.
TEST_LANE_A := test-unit test-sanity test-distroless
TEST_LANE_B := test-chart test-upgrade test-unprivileged fuzz
test: deps
	@s=$$SECONDS; $(MAKE) --no-print-directory unit-bin || exit 1; echo "make test: unit-bin took $$((SECONDS - s)) s"; \
	  steps() { for t in "$$@"; do s=$$SECONDS; $(MAKE) --no-print-directory $$t UNIT_BIN_BUILT=1 || { echo "make test: $$t FAILED after $$((SECONDS - s)) s"; return 1; }; \
	  echo "make test: $$t took $$((SECONDS - s)) s"; done; }; \
	  steps $(TEST_LANE_B) > /tmp/hostpath-test-lane-b.log 2>&1 & b=$$!; \
	  steps $(TEST_LANE_A); a=$$?; wait $$b; rb=$$?; \
	  echo "make test: the second lane ($(TEST_LANE_B)):"; cat /tmp/hostpath-test-lane-b.log; \
	  test $$a -eq 0 -a $$rb -eq 0 && steps targets-smoke

# The Helm chart: helm (built from its Go module in test/cluster/helm, into
# $(CACHE)/bin) lints and renders it, and a Go test checks that its
# defaults render deploy/'s objects and that its values reach them.
HELM = $(CACHE)/bin/helm
test-chart:
	$(MAKE) --no-print-directory -C test/cluster CACHE=$(CACHE) $(HELM)
	$(HELM) lint --strict charts/hostpath-csi
	$(HELM) template hostpath-csi charts/hostpath-csi --namespace hostpath-csi > /dev/null
	cd test/cluster/helm && HELM=$(HELM) $(GO) test -count=1 -v ./... | grep -E '^(---|ok|FAIL|PASS)|chart_test.go'; test $${PIPESTATUS[0]} -eq 0

# The packages make test-unit runs; make lint fails on a package that is
# in none of these nor in UNIT_ELSEWHERE (run by their own targets). The
# slowest first: two run at a time, and the last to start ends the run.
UNIT_PKGS := ./csi/... ./format/... ./engine/... ./archive/... ./test/crash/... ./transfer/... ./route/... ./test/stress/... ./iolimit/... ./loop/... ./kube/... ./fsops/... ./cmd/... ./registrar/... ./snapimport/... ./kubepeers/... ./kubeauth/... ./lostnodes/... ./kubestandby/... ./internal/... ./bench/cmd/... ./test/summary/... ./test/e2e/...
UNIT_ELSEWHERE := /bench /test/sanity /test/upgrade /test/kernel /test/kernel/guest /test/kernel/plan /test/powerloss/guest /test/powerloss/logwrites

# The race-built test binaries of test-unit and test-unprivileged, linked
# once for both: linking them is about 100 s of this runner's CPU (53 s
# with both cores) each time. make test builds them first and tells its
# steps (UNIT_BIN_BUILT=1); test-unit or test-unprivileged run alone build
# them themselves.
UNIT_DIR := /tmp/hostpath-unit
unit-bin: deps
	rm -rf $(UNIT_DIR) && mkdir -p $(UNIT_DIR)/bin $(UNIT_DIR)/json
	CGO_ENABLED=1 $(GO) test -race -c -o $(UNIT_DIR)/bin/ $(UNIT_PKGS) ./test/sanity

# Each package's binary in its directory, two at a time, as go test -json
# runs them (test2json makes the same events), then a summary: each
# package's counts and its 15 slowest tests. test2json reads the output
# rather than running the binary: it ignores SIGINT and SIGQUIT, which
# what it runs would inherit (a pgbench the tests stop with SIGINT ran on).
test-unit: deps $(if $(UNIT_BIN_BUILT),,unit-bin)
	@$(GO) list -f '{{if or .TestGoFiles .XTestGoFiles}}{{.ImportPath}} {{.Dir}}{{end}}' $(UNIT_PKGS) | grep . | \
	  xargs -P 2 -L 1 bash -c 'set -o pipefail; cd "$$1" && CGO_ENABLED=1 $(UNIT_DIR)/bin/$${0##*/}.test -test.v=test2json -test.count=1 -test.timeout=30m 2>&1 | \
	    $(GO) tool test2json -t -p "$$0" > $(UNIT_DIR)/json/$${0##*/}.json'; rc=$$?; \
	  cat $(UNIT_DIR)/json/*.json > /tmp/hostpath-unit.json; \
	  $(GO) run ./test/summary -slowest 15 < /tmp/hostpath-unit.json; src=$$?; test $$rc -eq 0 -a $$src -eq 0
	$(GO) -C test/cluster test -count=1 ./cmd/...
	$(GO) test -count=1 -run '^(TestMustPoints|TestCheckStandby)$$' ./test/kernel/

# The previous release (PREVIOUS_RELEASE, built through a git worktree) and
# this build on one state dir: upgrade, then rollback.
test-upgrade: deps
	$(GO) test -count=1 -v ./test/upgrade/ | grep -E '^(---|ok|FAIL|PASS)|upgrade_test.go'; test $${PIPESTATUS[0]} -eq 0

test-sanity: deps
	$(GO) test -count=1 -v ./test/sanity/ 2>&1 | tee /tmp/hostpath-sanity-mount.log | grep -E '^(csi-sanity|--- |ok |FAIL|PASS)' ; test $${PIPESTATUS[0]} -eq 0
	SANITY_ACCESS_TYPE=block $(GO) test -count=1 -v ./test/sanity/ 2>&1 | tee /tmp/hostpath-sanity-block.log | grep -E '^(csi-sanity|--- |ok |FAIL|PASS)' ; test $${PIPESTATUS[0]} -eq 0
	SANITY_LAYOUT=image $(GO) test -count=1 -v ./test/sanity/ 2>&1 | tee /tmp/hostpath-sanity-image.log | grep -E '^(csi-sanity|--- |ok |FAIL|PASS)|sanity_test.go' ; test $${PIPESTATUS[0]} -eq 0

# The tests as a user who is not root, with HOSTPATH_SKIP_PRIVILEGED=1:
# every test that needs root must skip, none may fail. Test binaries are
# built as root and run as nobody in their package directory, with the
# race detector as make test-unit builds them (its compiles are reused),
# and short (-test.short): a test whose long sample make test-unit just ran
# as root takes a smaller one, the binary's size test (a build of the
# module) is left to make test-unit. UNPRIV_SKIP are tests that need no
# root and pass as nobody, whose size is their subject (a 4,000-deep tree,
# deltas of large files, a flood of pulls): make test-unit runs them; as
# nobody they took 150 s of make test's second lane and prove no more.
UNPRIV_SKIP := ^(TestDeepTree|TestDelta|TestIndexedStreams|TestZstdReadByGNUTar|TestRestoreFromAnotherNodeUnderFlood|TestProgressReported|TestPullOutlivesTheRequest|TestJournalConcurrentAndFull)$$
UNPRIV_PKGS := ./loop ./fsops ./archive ./format/ext4 ./format/xfs ./csi ./engine ./engine/store ./cmd/hostpathplugin ./registrar ./snapimport ./test/e2e ./test/crash ./test/stress ./test/sanity
test-unprivileged: deps $(if $(UNIT_BIN_BUILT),,unit-bin)
	rm -rf /tmp/hostpath-unpriv && mkdir -p /tmp/hostpath-unpriv
	chmod a+rx $(UNIT_DIR) $(UNIT_DIR)/bin $(UNIT_DIR)/bin/*.test && chmod a+rwx /tmp/hostpath-unpriv
	printf '%s\n' $(UNPRIV_PKGS) | xargs -P 2 -I{} bash -c '\
	  p={}; n=$$(basename $$p); d=/tmp/hostpath-unpriv/$$n; mkdir -p $$d; chmod a+rwx $$d; \
	  (cd $$p && setpriv --reuid=65534 --regid=65534 --clear-groups \
	    env HOME=$$d TMPDIR=$$d HOSTPATH_SKIP_PRIVILEGED=1 $(UNIT_DIR)/bin/$$n.test -test.count=1 -test.short -test.skip '"'"'$(UNPRIV_SKIP)'"'"' -test.v > $$d.log 2>&1) \
	    || { echo "FAIL $$p as nobody:"; grep -E -- "--- FAIL|_test.go" $$d.log | head -20; exit 1; }; \
	  echo "ok $$p as nobody: $$(grep -c -- "--- SKIP" $$d.log || true) skipped"'

# Full benchmarks: every case run BENCH_ROUNDS times alternating ours and
# theirs on BENCH_SIZE MiB data sets; prints the ratio table and writes
# bench/results/{bench.txt,summary.md,ratios.svg}.
BENCH_SIZE   ?= 256
BENCH_ROUNDS ?= 3
# Seconds of each pgbench run of BenchmarkPgbench.
BENCH_PGSECONDS ?= 15
# Seconds of writing before each failover of BenchmarkStandbyFailoverLoss.
BENCH_LOSSSECONDS ?= 10
# csi-sanity against the binary alone in an empty root (only /dev, /proc,
# /sys and the kubelet directory), as it runs in a distroless image.
test-distroless: deps
	SANITY_CHROOT=1 $(GO) test -count=1 -v ./test/sanity/ 2>&1 | tee /tmp/hostpath-sanity-distroless-mount.log | grep -E '^(csi-sanity|--- |ok |FAIL|PASS)' ; test $${PIPESTATUS[0]} -eq 0
	SANITY_CHROOT=1 SANITY_ACCESS_TYPE=block $(GO) test -count=1 -v ./test/sanity/ 2>&1 | tee /tmp/hostpath-sanity-distroless-block.log | grep -E '^(csi-sanity|--- |ok |FAIL|PASS)' ; test $${PIPESTATUS[0]} -eq 0

# Each fuzz target briefly: a count of inputs, not a duration. Go 1.26's
# fuzzing coordinator can fail a target with "context deadline exceeded"
# and no crasher when a duration ends while a worker is mid-input
# (golang/go#75804, fixed in Go 1.27); it did so here in make test twice.
# A long run: make fuzz FUZZTIME=2000000x (or FUZZTIME=10m, with that risk).
FUZZTIME ?= 3000x
fuzz: deps
	$(GO) test -run '^$$' -fuzz '^FuzzPaginationToken$$' -fuzztime $(FUZZTIME) ./csi/
	$(GO) test -run '^$$' -fuzz '^FuzzIDsAndNames$$' -fuzztime $(FUZZTIME) ./csi/
	$(GO) test -run '^$$' -fuzz '^FuzzCreateVolume$$' -fuzztime $(FUZZTIME) ./csi/
	$(GO) test -run '^$$' -fuzz '^FuzzExtract$$' -fuzztime $(FUZZTIME) ./archive/

# The long versions of the reliability tests (the test command runs short ones).
# The stress test builds the driver with -race, which needs cgo.
STRESS_DURATION  ?= 60s
CRASH_ITERATIONS ?= 500
stress: deps
	CGO_ENABLED=1 STRESS_DURATION=$(STRESS_DURATION) $(GO) test -count=1 -v -run TestConcurrentClients ./test/stress/
	CRASH_ITERATIONS=$(CRASH_ITERATIONS) $(GO) test -count=1 -v -timeout 60m -run TestCrashConsistency ./test/crash/

# Built artifacts that are not source (images, Kubernetes binaries) live
# outside the repository.
CACHE     ?= $(HOME)/.cache/hostpath-csi
IMAGE_DIR ?= $(CACHE)/images
IMAGE     ?= ghcr.io/hostpath-csi/hostpathplugin

# The driver's image as an OCI archive, built in process (no Docker, no
# registry): the static binary alone on an empty base. The same commit
# gives the same bytes. Load it with `ctr -n k8s.io images import`,
# `docker load` or `podman load`. (The Dockerfile is for a registry build.)
image:
	$(GO) build -trimpath -ldflags="-s -w" -o $(BIN) ./cmd/hostpathplugin
	mkdir -p $(IMAGE_DIR)
	v=$$($(BIN) --version | tr + -) && \
	$(GO) -C test/cluster run ./cmd/ociimage -o $(IMAGE_DIR)/hostpathplugin.tar \
	  -ref $(IMAGE):$$v -file $(CURDIR)/$(BIN):/hostpathplugin:0755 -entrypoint /hostpathplugin \
	  -label org.opencontainers.image.version=$$v \
	  -label org.opencontainers.image.title=hostpathplugin \
	  -label org.opencontainers.image.source=https://github.com/hostpath-csi/hostpath && \
	echo "$(IMAGE_DIR)/hostpathplugin.tar: $(IMAGE):$$v sha256:$$(sha256sum < $(IMAGE_DIR)/hostpathplugin.tar | cut -d' ' -f1)"

# The previous release's image (its commit named in PREVIOUS_RELEASE),
# built from a git worktree in $(CACHE), as hostpathplugin-previous.tar
# beside the current one, and its deploy/ as previous-deploy-<commit>: the
# start of the rolling upgrade in make e2e, deployed as that release was.
PREVIOUS := $(shell sed -n 's/^commit //p' PREVIOUS_RELEASE)
image-previous:
	@test -d $(IMAGE_DIR)/previous-deploy-$(PREVIOUS) || { \
	  set -e; rm -rf $(IMAGE_DIR)/previous-deploy-*; mkdir -p $(IMAGE_DIR)/previous-deploy-$(PREVIOUS).tmp; \
	  git archive $(PREVIOUS) deploy | tar -x -C $(IMAGE_DIR)/previous-deploy-$(PREVIOUS).tmp; \
	  mv $(IMAGE_DIR)/previous-deploy-$(PREVIOUS).tmp/deploy $(IMAGE_DIR)/previous-deploy-$(PREVIOUS); \
	  rm -rf $(IMAGE_DIR)/previous-deploy-$(PREVIOUS).tmp; }
	@test -f $(IMAGE_DIR)/hostpathplugin-previous-$(PREVIOUS).tar || { \
	  set -e; rm -rf $(CACHE)/previous; git worktree prune; mkdir -p $(IMAGE_DIR); \
	  git worktree add --detach $(CACHE)/previous $(PREVIOUS) >/dev/null; \
	  (cd $(CACHE)/previous && $(GO) build -trimpath -o $(CACHE)/previous.bin ./cmd/hostpathplugin); \
	  git worktree remove --force $(CACHE)/previous; \
	  $(GO) -C test/cluster run ./cmd/ociimage -o $(IMAGE_DIR)/hostpathplugin-previous-$(PREVIOUS).tar \
	    -ref $(IMAGE):previous-$(shell echo $(PREVIOUS) | cut -c1-12) -file $(CACHE)/previous.bin:/hostpathplugin:0755 \
	    -entrypoint /hostpathplugin -label org.opencontainers.image.revision=$(PREVIOUS); \
	  rm -f $(CACHE)/previous.bin; }
	@for f in $(IMAGE_DIR)/hostpathplugin-previous-*.tar; do \
	  [ "$$f" = $(IMAGE_DIR)/hostpathplugin-previous-$(PREVIOUS).tar ] || rm -f "$$f"; done

BENCH_OUT    ?= bench/results
bench: deps
	$(GO) test -run '^$$' -bench . -benchtime=1x -timeout 120m ./bench/ -args -bench.size=$(BENCH_SIZE) -bench.rounds=$(BENCH_ROUNDS) -bench.pgseconds=$(BENCH_PGSECONDS) -bench.lossseconds=$(BENCH_LOSSSECONDS) | tee /tmp/hostpath-bench.txt; test $${PIPESTATUS[0]} -eq 0
	$(GO) run ./bench/cmd/benchreport -out $(BENCH_OUT) < /tmp/hostpath-bench.txt

# A single-node Kubernetes cluster on this machine, built from the
# projects' Go modules and Debian packages (test/cluster), and the
# end-to-end test that drives the driver through it. Builds are cached in
# $(CACHE): the first cluster-build takes a while (see docs/testing.md).
CLUSTER = $(MAKE) --no-print-directory -C test/cluster CACHE=$(CACHE)
cluster-deps: deps
	command -v runc >/dev/null && test -x /usr/lib/cni/bridge && test -x /bin/busybox && command -v iptables >/dev/null || \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq runc containernetworking-plugins busybox-static iptables conntrack iproute2 >/dev/null)
cluster-build: cluster-deps image image-previous
	$(CLUSTER) binaries images
# The harness is a Go test (test/cluster/localcluster): only tests start programs.
# NODES=N (1 to 9) makes every node a set of namespaces of its own, with
# its own containerd, kubelet, kube-proxy and disk (NODES=1: the host is the
# one node, as before).
NODES ?= 1
export NODES
LOCALCLUSTER = cd test/cluster && CACHE=$(CACHE) HOSTPATH_CLUSTER=$(subst cluster-,,$@) $(GO) test -count=1 -v -timeout 15m ./localcluster/
cluster-up: cluster-build
	$(LOCALCLUSTER) -run '^TestUp$$' | grep -v '^=== RUN\|^--- SKIP'; test $${PIPESTATUS[0]} -eq 0
cluster-down:
	$(LOCALCLUSTER) -run '^TestDown$$' | grep -v '^=== RUN\|^--- SKIP'; test $${PIPESTATUS[0]} -eq 0
# The snapshot CRDs and controller and deploy/ applied to the running
# cluster as a user would, waiting for the driver on every node.
cluster-deploy: cluster-deps
	cd test/cluster && HOSTPATH_E2E=1 HOSTPATH_E2E_DEPLOY_ONLY=1 CACHE=$(CACHE) $(GO) test -count=1 -v -run TestKubernetes ./e2e/ 2>&1 | grep -E '^(e2e |--- |ok|FAIL)|_test.go:'; test $${PIPESTATUS[0]} -eq 0
	@echo "try it: KUBECONFIG=$(CACHE)/cluster/admin.kubeconfig $(CACHE)/bin/kubectl get nodes,csinodes,csistoragecapacities -A"
# KEEP_CLUSTER=1 leaves the cluster up after the test, to look around.
# E2E_INSTALL=helm installs the driver with helm install (the chart with
# its defaults but the image) instead of kubectl apply -k deploy/, and ends
# with helm upgrade and helm uninstall.
E2E_INSTALL ?= kubectl
e2e: cluster-up
	[ "$(E2E_INSTALL)" != helm ] || $(MAKE) --no-print-directory -C test/cluster CACHE=$(CACHE) $(HELM)
	cd test/cluster && HOSTPATH_E2E=1 HOSTPATH_E2E_INSTALL=$(E2E_INSTALL) CACHE=$(CACHE) $(GO) test -count=1 -v -timeout 40m ./e2e/ 2>&1 | tee /tmp/hostpath-e2e.log | grep -E '^(e2e |--- |ok|FAIL|PASS)|_test.go:'; rc=$${PIPESTATUS[0]}; \
	  [ -n "$(KEEP_CLUSTER)" ] || $(MAKE) --no-print-directory -C $(CURDIR) cluster-down || rc=1; exit $$rc

# Velero backing up a running PostgreSQL (test/cluster/e2e/backup_test.go):
# Velero, its AWS plugin and versitygw built from their modules into
# images, a cluster of 2 nodes (the restores run on the node the database
# did not), three backups and their restores. Not in .ci/run: docs/backup.md
# says why and what it takes.
e2e-backup: NODES = 2
e2e-backup: cluster-up
	$(CLUSTER) backup-images
	cd test/cluster && HOSTPATH_E2E_BACKUP=1 CACHE=$(CACHE) $(GO) test -count=1 -v -timeout 40m -run '^TestBackup$$' ./e2e/ 2>&1 | tee /tmp/hostpath-e2e-backup.log | grep -E '^(e2e |--- |ok|FAIL|PASS)|_test.go:'; rc=$${PIPESTATUS[0]}; \
	  [ -n "$(KEEP_CLUSTER)" ] || $(MAKE) --no-print-directory -C $(CURDIR) cluster-down NODES=2 || rc=1; exit $$rc

# The Kubernetes external-storage e2e suite (k8s.io/kubernetes v1.37.2
# e2e.test, run by ginkgo) against the driver deployed from deploy/, with
# deploy/test-driver.yaml (image volumes, deploy/'s default layout;
# E2E_DRIVER=deploy/test-driver-directory.yaml for directory volumes); E2E_SKIP adds \[Serial\] to the default skips,
# `make e2e-suite E2E_SKIP='\[Disruptive\]|\[Feature:SELinux\]|alpha' E2E_FOCUS='External.Storage.*\[Serial\]' E2E_PROCS=1`
# runs the serial set. The summary goes to test/cluster/e2e/results/.
E2E_FOCUS ?= External.Storage
E2E_SKIP  ?= \[Serial\]|\[Disruptive\]|\[Feature:SELinux\]|alpha
E2E_PROCS ?= 3
E2E_DRIVER ?= deploy/test-driver.yaml
E2E_OUT   ?= /tmp/hostpath-e2e-suite
E2E_SUMMARY ?= test/cluster/e2e/results/parallel.md
e2e-suite: cluster-build
	$(CLUSTER) suite
	$(MAKE) --no-print-directory cluster-up
	cd test/cluster && HOSTPATH_E2E=1 HOSTPATH_E2E_DEPLOY_ONLY=1 CACHE=$(CACHE) $(GO) test -count=1 -run TestKubernetes ./e2e/ | tail -3
	rm -rf $(E2E_OUT) && mkdir -p $(E2E_OUT)
	KUBE_TEST_REPO_LIST=$(CURDIR)/test/cluster/e2e/repo-list.yaml $(CACHE)/bin/ginkgo -p --procs=$(E2E_PROCS) --no-color \
	  --focus='$(E2E_FOCUS)' --skip='$(E2E_SKIP)' --timeout=3h --output-dir=$(E2E_OUT) --json-report=report.json \
	  $(CACHE)/bin/e2e.test -- -kubeconfig=$(CACHE)/cluster/admin.kubeconfig -provider=local \
	  -storage.testdriver=$(CURDIR)/$(E2E_DRIVER) -repo-root=$(CURDIR) -report-dir=$(E2E_OUT) 2>&1 | tee $(E2E_OUT)/run.log | grep -E '^(Ran |PASS|FAIL|SUCCESS|  \[FAIL\])'; \
	  rc=$${PIPESTATUS[0]}; \
	  mkdir -p test/cluster/e2e/results; $(GO) -C test/cluster run ./cmd/suitesummary -cmd "make e2e-suite E2E_DRIVER=$(E2E_DRIVER) E2E_FOCUS='$(E2E_FOCUS)' E2E_SKIP='$(E2E_SKIP)' E2E_PROCS=$(E2E_PROCS)" \
	    < $(E2E_OUT)/report.json > $(E2E_SUMMARY) && sed -n 5p $(E2E_SUMMARY); \
	  [ -n "$(KEEP_CLUSTER)" ] || $(MAKE) --no-print-directory -C $(CURDIR) cluster-down || rc=1; exit $$rc

# 10,000 volumes on one node (create latency first vs last thousand,
# ListVolumes paging, restart time), peak memory of a 10 GiB snapshot and
# restore, and a million empty files cloned, archived and restored.
# The volume run goes first: mass deletes (the million files) slow file
# creation on a journal-less ext4 for minutes, which is not the driver.
SCALE_VOLUMES ?= 10000
SCALE_MEM_GIB ?= 10
SCALE_FILES   ?= 1000000
scale: deps
	$(GO) test -run '^$$' -bench 'BenchmarkScale$$' -benchtime=1x -timeout 30m ./bench/ -args -scale.volumes=$(SCALE_VOLUMES)
	$(GO) test -run '^$$' -bench 'BenchmarkSnapshotMemory|BenchmarkManyFiles' -benchtime=1x -timeout 90m ./bench/ -args -mem.gib=$(SCALE_MEM_GIB) -many.files=$(SCALE_FILES)

# Every target the README and docs/testing.md name, in a short form, so none rots unseen:
# run (started, probed, stopped), demo, image (twice: same bytes), stress
# (12 kills: the crash test needs one inside an operation, about half are),
# scale and bench on tiny sizes (bench results to a scratch directory).
# Each target also installs what it needs on a fresh machine by itself:
# the Debian packages (deps), the cluster's (cluster-deps), QEMU and the
# kernels (kernel-deps) are among its prerequisites (test/targets/needs).
targets-smoke:
	test/targets/needs deps test test-unit test-sanity test-distroless test-unprivileged test-upgrade fuzz bench bench-smoke scale stress ci test-all
	test/targets/needs cluster-deps cluster-build cluster-up cluster-deploy e2e e2e-suite e2e-backup
	test/targets/needs kernel-deps test-kernel test-powerloss test-kernel-sample test-powerloss-sample
	rm -rf /tmp/hostpath-run-smoke; $(MAKE) --no-print-directory run RUN_DIR=/tmp/hostpath-run-smoke > /tmp/hostpath-run-smoke.log 2>&1 & \
	  for i in $$(seq 300); do [ -S /tmp/hostpath-run-smoke/csi.sock ] && break; sleep 0.1; done; \
	  $(CTL) --endpoint=unix:///tmp/hostpath-run-smoke/csi.sock info > /dev/null; rc=$$?; \
	  pkill -TERM -f '^bin/hostpathplugin --endpoint=unix:///tmp/hostpath-run-smoke/csi.sock'; wait; \
	  test $$rc -eq 0 && echo "make run: served and stopped"
	$(MAKE) --no-print-directory demo
	$(MAKE) --no-print-directory image | tail -1 | tee /tmp/hostpath-image-1.txt; test $${PIPESTATUS[0]} -eq 0
	$(MAKE) --no-print-directory image | tail -1 | tee /tmp/hostpath-image-2.txt; test $${PIPESTATUS[0]} -eq 0
	cmp /tmp/hostpath-image-1.txt /tmp/hostpath-image-2.txt && echo "make image: reproducible"
	$(MAKE) --no-print-directory stress STRESS_DURATION=3s CRASH_ITERATIONS=12 2>&1 | grep -E '^(--- |ok|FAIL)'; test $${PIPESTATUS[0]} -eq 0
	$(MAKE) --no-print-directory scale SCALE_VOLUMES=50 SCALE_MEM_GIB=0 SCALE_FILES=500 2>&1 | grep -E '^(ok|FAIL|Benchmark)'; test $${PIPESTATUS[0]} -eq 0
	$(MAKE) --no-print-directory bench BENCH_SIZE=2 BENCH_ROUNDS=1 BENCH_PGSECONDS=2 BENCH_LOSSSECONDS=2 BENCH_OUT=/tmp/hostpath-bench-target 2>&1 | grep -E '^(ok|FAIL|PASS)'; test $${PIPESTATUS[0]} -eq 0
	@m=$$(stat -c %a /tmp); test "$$m" = 1777 || { echo "/tmp is $$m after the tests, not 1777: a test changed the system's directories"; exit 1; }

# Each benchmark once on tiny data, so the suite never rots.
bench-smoke: deps
	$(GO) test -run '^$$' -bench . -benchtime=1x ./bench/ -args -bench.size=2 -bench.pgseconds=2 -bench.lossseconds=2 | tee /tmp/hostpath-bench-smoke.txt | grep -E '^(ok|FAIL|PASS)'; test $${PIPESTATUS[0]} -eq 0
	$(GO) run ./bench/cmd/benchreport -out /tmp/hostpath-bench-smoke < /tmp/hostpath-bench-smoke.txt > /dev/null

# golangci-lint v2 with .golangci.yml (whose depguard rules are the
# layering rules of CONTRIBUTING.md), built once from test/lint's go.mod
# (about 5 minutes cold) into the cache.
GOLANGCI_LINT := $(CACHE)/bin/golangci-lint
$(GOLANGCI_LINT): test/lint/go.mod test/lint/go.sum
	$(GO) -C test/lint build -o $(GOLANGCI_LINT) github.com/golangci/golangci-lint/v2/cmd/golangci-lint

lint: $(GOLANGCI_LINT)
	test -z "$$(gofmt -l $$(git ls-files '*.go'))" || (gofmt -l $$(git ls-files '*.go'); exit 1)
	$(GOLANGCI_LINT) run ./...
	$(GO) -C test/cluster vet ./...
	$(GO) -C test/cluster/helm vet ./...
	@left=$$(comm -23 <($(GO) list ./... | sed 's|^github.com/hostpath-csi/hostpath||' | sort) \
	  <( ($(GO) list $(UNIT_PKGS) | sed 's|^github.com/hostpath-csi/hostpath||'; printf '%s\n' $(UNIT_ELSEWHERE)) | sort)); \
	  test -z "$$left" || { echo "packages no test target runs (add them to UNIT_PKGS): $$left"; exit 1; }

# The tests in QEMU guests booting Debian's stock kernels (test/kernel):
# each suite's linux-image-amd64 is downloaded, through the mirrors this
# machine's apt is configured with (test/kernel/apt-mirrors), and unpacked under
# $(KERNEL_CACHE), never installed; TCG, since there is no /dev/kvm.
# KERNEL_SUITES=bookworm runs one kernel, KERNEL_TESTS=csi one package,
# KERNEL_RUN=<pattern> only the tests it matches. Ends with "N passed, M failed".
KERNEL_SUITES ?= bookworm bullseye
KERNEL_CACHE  ?= $(CACHE)/kernel
KERNEL_BIN    := $(KERNEL_CACHE)/bin
KERNEL_TESTS  ?= loop fsops iolimit archive format/ext4 format/xfs csi engine engine/store test/sanity
kernel-deps: deps
	command -v qemu-system-x86_64 >/dev/null || \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends qemu-system-x86 >/dev/null)
	set -e; for s in $(KERNEL_SUITES); do \
	  test -d $(KERNEL_CACHE)/$$s/boot && continue; \
	  m=$$(test/kernel/apt-mirrors); main=$$(echo "$$m" | sed -n 1p); sec=$$(echo "$$m" | sed -n 2p); \
	  a=$(KERNEL_CACHE)/apt-$$s; mkdir -p $$a/lists/partial $$a/cache; \
	  k='[signed-by=/usr/share/keyrings/debian-archive-keyring.gpg]'; \
	  printf 'deb %s %s %s main\ndeb %s %s %s-security main\n' "$$k" $$main $$s "$$k" $$sec $$s > $$a/sources.list; \
	  o="-o Dir::Etc::SourceList=$$a/sources.list -o Dir::Etc::SourceParts=- -o Dir::State::Lists=$$a/lists -o Dir::Cache=$$a/cache -o APT::Get::List-Cleanup=0"; \
	  apt-get $$o update -qq; \
	  pkg=$$(apt-cache $$o depends linux-image-amd64 | awk '/Depends: linux-image-/ {print $$2; exit}'); \
	  (cd $$a && rm -f *.deb && apt-get $$o download $$pkg 2>&1 | grep -v '^W: Download is performed unsandboxed'); \
	  rm -rf $(KERNEL_CACHE)/$$s.tmp && dpkg-deb -x $$a/$$pkg*.deb $(KERNEL_CACHE)/$$s.tmp && rm $$a/$$pkg*.deb; \
	  mv $(KERNEL_CACHE)/$$s.tmp $(KERNEL_CACHE)/$$s; echo "kernel $$pkg unpacked in $(KERNEL_CACHE)/$$s"; done
# Power loss for real (test/kernel's TestPowerLoss): a guest of the first
# kernel suite records the driver's workload on ext4 and XFS through
# dm-log-writes; the host replays the log to every flush point (at most 300
# each, and points between flushes) and checks each. Ends with
# "N passed, M failed" (points). POWERLOSS_DRIVER_COMMIT=<commit> records
# and checks the driver of that commit instead (built through a worktree).
PL_BIN := $(KERNEL_CACHE)/powerloss-bin
test-powerloss: KERNEL_SUITES := $(firstword $(KERNEL_SUITES))
test-powerloss: kernel-deps
	rm -rf $(PL_BIN) && mkdir -p $(PL_BIN)/recorder
	$(GO) test -c -o $(PL_BIN)/init ./test/kernel/guest
	@if [ -n "$(POWERLOSS_DRIVER_COMMIT)" ]; then set -e; \
	  echo "recording and checking with the driver of $(POWERLOSS_DRIVER_COMMIT)"; \
	  rm -rf $(CACHE)/powerloss-driver; git worktree prune; git worktree add --detach $(CACHE)/powerloss-driver $(POWERLOSS_DRIVER_COMMIT) >/dev/null; \
	  (cd $(CACHE)/powerloss-driver && $(GO) build -o $(PL_BIN)/hostpathplugin ./cmd/hostpathplugin); \
	  git worktree remove --force $(CACHE)/powerloss-driver; \
	else $(GO) build -o $(PL_BIN)/hostpathplugin ./cmd/hostpathplugin; fi
	$(GO) test -c -o $(PL_BIN)/recorder/record.test ./test/powerloss/guest
	HOSTPATH_KERNELS="$(KERNEL_CACHE)/$(firstword $(KERNEL_SUITES))" HOSTPATH_KERNEL_BIN=$(PL_BIN) HOSTPATH_KERNEL_WORK=$(KERNEL_CACHE)/work \
	  HOSTPATH_POWERLOSS_RECORDER=$(PL_BIN)/recorder/record.test HOSTPATH_POWERLOSS_POINTS=$(HOSTPATH_POWERLOSS_POINTS) \
	  $(GO) test -count=1 -v -timeout 150m -run '^TestPowerLoss$$' ./test/kernel/ 2>&1 | tee /tmp/hostpath-powerloss.log | \
	  grep --line-buffered -E '^(powerloss|lost: |recorded|@@guest|[0-9]+ passed|--- |ok|FAIL)|_test.go:'; test $${PIPESTATUS[0]} -eq 0

# What .ci/run runs, in order: every gate a submission must pass, inside
# CI's time (docs/testing.md has each step's time). The long suites run
# as samples here and whole in make test-all.
ci: deps lint test test-kernel-sample test-powerloss-sample
	$(MAKE) --no-print-directory e2e NODES=3

# Everything: what CI runs and the full long suites it samples.
test-all: ci test-kernel test-powerloss
	$(MAKE) --no-print-directory e2e E2E_INSTALL=helm

# The kernel guests' sample: one kernel (Debian 12's), the tests of
# quotas, freezes and growth, where the kernel's interfaces differ most.
KERNEL_SAMPLE_TESTS := fsops format/ext4 format/xfs csi
KERNEL_SAMPLE_RUN   := Quota|Freez|Thaw|Grow|Expan
test-kernel-sample: KERNEL_SUITES := bookworm
test-kernel-sample: kernel-deps
	$(MAKE) --no-print-directory test-kernel KERNEL_SUITES=$(KERNEL_SUITES) KERNEL_TESTS='$(KERNEL_SAMPLE_TESTS)' KERNEL_RUN='$(KERNEL_SAMPLE_RUN)'

# The power-loss replay's sample: POWERLOSS_POINTS flush points spread
# over each file system's run, and the flushes around each of the
# journal's checkpoints and the driver's kills (the one inside a freeze
# among them; about 40 more), each with its reordered point after it, and
# one recovery cut again per file system. The full run: make
# test-powerloss.
POWERLOSS_POINTS ?= 20
test-powerloss-sample: KERNEL_SUITES := $(firstword $(KERNEL_SUITES))
test-powerloss-sample: kernel-deps
	$(MAKE) --no-print-directory test-powerloss HOSTPATH_POWERLOSS_POINTS=$(POWERLOSS_POINTS)

test-kernel: kernel-deps
	rm -rf $(KERNEL_BIN) && mkdir -p $(KERNEL_BIN)
	$(GO) test -c -o $(KERNEL_BIN)/init ./test/kernel/guest
	$(GO) build -o $(KERNEL_BIN)/hostpathplugin ./cmd/hostpathplugin
	set -e; for p in $(KERNEL_TESTS); do $(GO) test -c -o $(KERNEL_BIN)/$$(basename $$p).test ./$$p; done
	HOSTPATH_KERNELS="$(foreach s,$(KERNEL_SUITES),$(KERNEL_CACHE)/$(s))" HOSTPATH_KERNEL_BIN=$(KERNEL_BIN) HOSTPATH_KERNEL_WORK=$(KERNEL_CACHE)/work HOSTPATH_KERNEL_RUN='$(KERNEL_RUN)' \
	  $(GO) test -count=1 -v -timeout 80m -run '^TestKernel$$' ./test/kernel/ > /tmp/hostpath-kernel.log 2>&1 & pid=$$!; \
	  tail -n +1 -f --pid=$$pid /tmp/hostpath-kernel.log | grep --line-buffered -v '^=== RUN\|--- PASS\|^PASS$$\|^ok \|^[0-9]* passed, [0-9]* failed$$'; \
	  wait $$pid; rc=$$?; grep -E '^[0-9]+ passed, [0-9]+ failed$$' /tmp/hostpath-kernel.log || echo "0 passed, 1 failed (the harness did not finish: /tmp/hostpath-kernel.log)"; exit $$rc

# Tools the tests use to prepare their world (the driver needs none),
# PostgreSQL, the database the point-in-time snapshot tests run, and fio,
# which the I/O benchmarks compare with.
deps:
	command -v mkfs.xfs >/dev/null && command -v mkfs.btrfs >/dev/null && command -v pigz >/dev/null && command -v skopeo >/dev/null && command -v fio >/dev/null && ls /usr/lib/postgresql/*/bin/pg_amcheck >/dev/null 2>&1 || \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq xfsprogs btrfs-progs e2fsprogs tar coreutils attr pigz util-linux skopeo postgresql fio >/dev/null)

clean:
	rm -rf bin
