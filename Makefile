# Starling: build, test, benchmark and demo.
#
#   make demo    bring up a local cluster in network namespaces and run the main job
#   make test    unit, fuzz-seed and end-to-end tests (e2e needs root)
#   make bench   benchmarks: pure-core go benchmarks, node, rules and cluster figures (root)
#
# `test`, `demo` and `bench` run `deps` first, so each works alone on a fresh
# Debian machine.

SHELL        := /bin/bash
GO           ?= go
BIN          := bin/starling
VERSION      ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
LDFLAGS      := -X github.com/starling-orchestrator/starling/node.Version=$(VERSION)
# A static binary: it runs on any distribution, and without cgo's runtime
# and libc mapped the idle agent's RSS is 33 MiB, not 45 (make bench).
export CGO_ENABLED := 0
# A go.work in a parent directory (/tmp/go.work, say) must not change
# what is built: the module is built as go.mod says.
export GOWORK := off
DEB_PACKAGES := containerd runc iptables nftables containernetworking-plugins iproute2 util-linux busybox-static btrfs-progs
DEMO_DIR     ?= /var/tmp/starling-demo
# Real server software for the end-to-end tests, downloaded (never
# installed) from Debian: test/imagebuild packs it into images.
TEST_DEBS    := nginx nginx-common redis-tools liblzf1 libjemalloc2
TEST_DEB_DIR ?= /var/cache/starling/test-debs
export STARLING_TEST_DEBS := $(TEST_DEB_DIR)

.PHONY: all deps build test unit bench demo demo-down fuzz vet clean

all: build

# Installs the Debian packages the agent and the tests need, when missing,
# and downloads the Go modules.
deps:
	@missing=""; for p in $(DEB_PACKAGES); do \
		dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q "install ok installed" || missing="$$missing $$p"; \
	done; \
	if [ -n "$$missing" ]; then \
		echo "installing Debian packages:$$missing"; \
		if [ "$$(id -u)" != 0 ]; then echo "need root to install:$$missing" >&2; exit 1; fi; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing >/dev/null; \
	fi
	@missing=""; for p in $(TEST_DEBS); do ls $(TEST_DEB_DIR)/$${p}_*.deb >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ] && [ "$$(id -u)" = 0 ]; then \
		echo "downloading Debian packages for test images:$$missing"; \
		mkdir -p $(TEST_DEB_DIR) && cd $(TEST_DEB_DIR) && { apt-get download $$missing >/dev/null 2>&1 || { apt-get update -qq && apt-get download $$missing >/dev/null; }; }; \
	fi
	@$(GO) mod download

build:
	@mkdir -p bin
	$(GO) build -ldflags "$(LDFLAGS)" -o $(BIN) ./cmd/starling

vet:
	$(GO) vet ./...

# All tests. As root the end-to-end tests (real containerd in network
# namespaces) must run: STARLING_E2E_REQUIRED=1 turns a missing
# prerequisite into a failure instead of a skip. The packages' own tests
# run first and the end-to-end tests after them, not beside them: the
# in-process cluster tests (20 agents on 2 cores) bound convergence times
# that assume the cores are theirs. The agent picks the nftables
# backend for Service rules here; the Service tests then run again on the
# iptables backend (DATAPLANE_E2E). The last line counts tests: "N
# passed, N failed, N skipped".
DATAPLANE_E2E := ^(TestServices|TestUDPService|TestReadinessDrivesEndpoints|TestOutOfWindowSegment|TestRulesGoWhere)
test: deps
	@set -o pipefail; \
	if [ "$$(id -u)" = 0 ]; then export STARLING_E2E_REQUIRED=1; else echo "not root: end-to-end tests will be skipped"; fi; \
	log=$$(mktemp); \
	{ $(GO) test -count=1 -timeout 20m -v $$($(GO) list ./... | grep -v '/test/e2e$$'); unit=$$?; \
	  $(GO) test -count=1 -timeout 40m -v ./test/e2e; e2e=$$?; \
	  echo "e2e: the Service tests again, on the iptables backend"; \
	  STARLING_E2E_PROXY_MODE=iptables $(GO) test -count=1 -timeout 20m -v -run '$(DATAPLANE_E2E)' ./test/e2e; ipt=$$?; \
	  exit $$((unit | e2e | ipt)); } 2>&1 | tee $$log | grep -E '^(=== RUN|--- (PASS|FAIL|SKIP)|(ok|FAIL|PASS)\b|panic:|e2e: |\s+\S+_test\.go:[0-9]+:)' | grep -v '^=== RUN'; \
	status=$$?; \
	passed=$$(grep -cE '^\s*--- PASS' $$log); failed=$$(grep -cE '^\s*--- FAIL' $$log); skipped=$$(grep -cE '^\s*--- SKIP' $$log); \
	if [ $$status != 0 ]; then echo "==== full output of the failed run ===="; grep -v '^=== RUN' $$log; fi; \
	rm -f $$log; \
	echo "tests: $$passed passed, $$failed failed, $$skipped skipped"; \
	exit $$status

# Runs each fuzz target for FUZZTIME (default 30s).
FUZZTIME ?= 30s
GOSSIP_FUZZ := FuzzDecodeMessage FuzzDecodeDelta FuzzDecodeRecords FuzzDecodeRecordsZ FuzzDecodeDigest FuzzDecodeRequest FuzzDecodePull FuzzDecodeHave FuzzDecodeLeave FuzzDecodeQuestion FuzzDecodeCoordinate FuzzNotifyMsg
fuzz:
	$(GO) test ./node/manifest/ -run=NONE -fuzz='^FuzzParse$$' -fuzztime=$(FUZZTIME)
	$(GO) test ./node/manifest/ -run=NONE -fuzz='^FuzzDecode$$' -fuzztime=$(FUZZTIME)
	$(GO) test ./gossip/crdt/ -run=NONE -fuzz='^FuzzDecodeRecord$$' -fuzztime=$(FUZZTIME)
	$(GO) test ./node/ -run=NONE -fuzz='^FuzzStatusToDataplane$$' -fuzztime=$(FUZZTIME)
	$(GO) test ./node/ -run=NONE -fuzz='^FuzzDecodeMemberMeta$$' -fuzztime=$(FUZZTIME)
	$(GO) test ./node/ -run=NONE -fuzz='^FuzzDecodeUpQuestion$$' -fuzztime=$(FUZZTIME)
	$(GO) test ./node/quorum/ -run=NONE -fuzz='^FuzzDecodeHist$$' -fuzztime=$(FUZZTIME)
	@for f in $(GOSSIP_FUZZ); do \
		$(GO) test ./gossip/ -run=NONE -fuzz="^$$f$$" -fuzztime=$(FUZZTIME) -fuzzminimizetime=2s -parallel=1 || exit 1; \
	done

# Figures: placement time (10,000 replicas on 1,000 nodes), gossip write
# latency to all of 5/20/50 nodes and idle traffic per node at 20 (memberlist
# LAN defaults on loopback), and the figures of test/bench (root): node
# (apply -> Running, agent RSS), Service rules, and cluster (3 nodes:
# failover and rolling-update durations; about 10 minutes), then the scale
# simulation at 100 and 300 nodes (node/sim_test.go; 1,000 nodes:
# STARLING_SIM=1000 go test ./node -run TestScaleSimulation -v -timeout 4h).
bench: deps
	$(GO) test -run=NONE -bench=. -benchmem ./placement/ ./node/...
	@set -o pipefail; GOSSIP_FIGURES=1 GOSSIP_FIGURES_WINDOW=20s $(GO) test ./gossip/ -run '^TestFigures$$' -v -count=1 -timeout 30m | grep -E 'figures_test|^(ok|FAIL|---)'
	$(GO) run ./test/bench
	@set -o pipefail; STARLING_SIM=100 $(GO) test ./node/ -run '^TestScaleSimulation$$' -v -count=1 -timeout 3h | grep -E 'sim[a-z]*_test|^(ok|FAIL|---)'
	@set -o pipefail; STARLING_SIM=300 $(GO) test ./node/ -run '^TestScaleSimulation$$' -v -count=1 -timeout 3h | grep -E 'sim[a-z]*_test|^(ok|FAIL|---)'

# A three-node cluster in network namespaces, the main scenario and a summary
# of checks. KEEP=1 leaves the cluster running for you to try the CLI
# (bin/starling); demo-down removes it (a new `make demo` does too, first).
demo: deps build
	$(GO) run ./test/demo --dir $(DEMO_DIR) --binary $(BIN) --debs $(TEST_DEB_DIR) $(if $(KEEP),--keep)

demo-down:
	$(GO) run ./test/demo --dir $(DEMO_DIR) --down

clean:
	rm -rf bin
