# Thin wrapper over CMake + CTest + pytest.
#   make run        build, then run the main job on the built-in default
#   make test       build, then run every test (C tests through CTest, Python oracles through pytest)
#   make test SAN=1 the same under AddressSanitizer + UndefinedBehaviorSanitizer
#   make bench      every benchmark
#   make install PREFIX=DIR  install the library, its headers, dsv4 and the packages (default /usr/local)
SAN ?= 0
JOBS ?= $(shell nproc)
ifeq ($(SAN),1)
BUILD ?= build-san
CMAKE_FLAGS += -DDSV4_SANITIZE=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo
SAN_ENV = LD_PRELOAD=$$(gcc -print-file-name=libasan.so) ASAN_OPTIONS=detect_leaks=0 UBSAN_OPTIONS=halt_on_error=1
else
BUILD ?= build
CMAKE_FLAGS += -DCMAKE_BUILD_TYPE=Release
SAN_ENV =
endif
PYTEST_ARGS ?=
# BUILD may be relative to this folder or absolute
B = $(abspath $(BUILD))

PREFIX ?= /usr/local

.PHONY: all deps build run test test-c test-py test-gpu bench install clean
all: build

deps:
	@bash scripts/install-deps.sh

$(BUILD)/CMakeCache.txt:
	cmake -S . -B $(BUILD) $(CMAKE_FLAGS)

build: deps $(BUILD)/CMakeCache.txt
	cmake --build $(BUILD) -j $(JOBS)

run: build
	$(B)/dsv4 info
	$(B)/dsv4 bench formats --quick
	@test -f $(B)/tiny/tokenizer.json || $(B)/dsv4 make-tiny --out $(B)/tiny
	@echo 'chat prompt in: "Hello! Who are you?"  (the tiny model'"'"'s weights are random: the text out is noise, the speed is real)'
	$(B)/dsv4 run --model $(B)/tiny --chat "Hello! Who are you?" --max-tokens 32 --mtp 2

test: build
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS)
	DSV4_LIB=$(B)/libdsv4.so PYTHONPATH=$(CURDIR)/python $(SAN_ENV) \
	  python3 -m pytest -q tests/python $(PYTEST_ARGS)

# Headers, libdsv4.so/.a, the backend modules, dsv4, dsv4.pc and the CMake package under PREFIX.
install: build
	cmake --install $(BUILD) --prefix $(PREFIX)

# The cuda backend on a machine with an NVIDIA GPU (skips without one): tests/gpu/run_gpu_tests.sh
test-gpu:
	BUILD=$(CURDIR)/build-gpu bash tests/gpu/run_gpu_tests.sh

bench: build
	$(B)/dsv4 bench startup
	$(B)/dsv4 bench bandwidth
	$(B)/dsv4 bench formats
	$(B)/dsv4 bench attention
	$(B)/dsv4 bench linear
	DSV4_BUILD=$(B) bash bench/ggml_peer.sh
	$(B)/dsv4 bench layer
	$(B)/dsv4 bench model
	$(B)/dsv4 bench memory
	$(B)/dsv4 bench run
	$(B)/dsv4 bench serve
	DSV4_LIB=$(B)/libdsv4.so PYTHONPATH=$(CURDIR)/python:$(CURDIR)/tests/python python3 bench/bench_tokenizer.py

clean:
	rm -rf build build-san
