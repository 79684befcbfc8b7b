# Compiler flags shared by every metro target.
#
# The baseline is x86-64 with SSE4.2: no -march=native anywhere. SIMD kernels live in files
# whose names end in _avx2.cpp or _avx512.cpp; only those get wider instruction sets, and
# they run only after base/cpu_features says the CPU has them.

set(METRO_WARNINGS -Wall -Wextra -Wpedantic -Werror -Wnon-virtual-dtor
    -Wno-missing-field-initializers)
if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
  list(APPEND METRO_WARNINGS -Wshadow=local)
  # GCC 12 raises false positives deep in libstdc++ at -O2/-O3 (PR 105329, 105651).
  list(APPEND METRO_WARNINGS -Wno-restrict -Wno-stringop-overflow -Wno-array-bounds
       -Wno-maybe-uninitialized)
endif()

if(CMAKE_SYSTEM_PROCESSOR MATCHES "x86_64|AMD64")
  set(METRO_BASELINE_ARCH -msse4.2 -mpopcnt)
  set(METRO_AVX2_FLAGS -mavx2 -mfma -mf16c -mbmi2)
  set(METRO_AVX512_FLAGS -mavx2 -mfma -mf16c -mbmi2 -mavx512f -mavx512bw -mavx512vl
      -mavx512dq -mavx512vnni)
endif()

# Sanitizer and fuzz builds: -O1 with line tables only. Full debug info makes GCC's variable
# tracking superlinear under ASan (one grammar file took minutes at -O2 -g, seconds at -O1 -g1)
# and the reports need only file:line. The numeric hot paths (kernels, the CPU backend, the
# model's forward pass) keep -O2 so the sanitized suite does not crawl through them.
set(METRO_SAN_FLAGS "")
set(METRO_SAN_HOT_FLAGS "")
if(CMAKE_CXX_COMPILER_ID STREQUAL "Clang")
  set(METRO_LINE_TABLES -gline-tables-only)
else()
  set(METRO_LINE_TABLES -g1)
endif()
if(METRO_SANITIZE)
  set(METRO_SAN_FLAGS -fsanitize=address,undefined -fno-sanitize-recover=undefined
      -fno-omit-frame-pointer -O1 ${METRO_LINE_TABLES})
  set(METRO_SAN_HOT_FLAGS -O2)
endif()
if(METRO_FUZZ)
  set(METRO_SAN_FLAGS -fsanitize=fuzzer-no-link,address,undefined
      -fno-sanitize-recover=undefined -fno-omit-frame-pointer -O1 ${METRO_LINE_TABLES})
  set(METRO_SAN_HOT_FLAGS -O2)
endif()

# nvcc: its own warnings are errors, and the host compiler's on the code it hands over.
set(METRO_CUDA_FLAGS --Werror=all-warnings -Xcompiler=-Wall -Xcompiler=-Wextra
    -Xcompiler=-Werror -Xcompiler=-Wno-missing-field-initializers)

function(metro_target_flags target)
  target_compile_options(${target} PRIVATE
                         "$<$<COMPILE_LANGUAGE:CXX>:${METRO_WARNINGS};${METRO_BASELINE_ARCH};${METRO_SAN_FLAGS}>"
                         "$<$<COMPILE_LANGUAGE:CUDA>:${METRO_CUDA_FLAGS}>")
  if(METRO_SANITIZE OR METRO_FUZZ)
    target_link_options(${target} PRIVATE -fsanitize=address,undefined)
  endif()
endfunction()

# Gives SIMD files their instruction-set flags, and the numeric hot paths their optimization
# level in sanitizer and fuzz builds.
function(metro_simd_sources sources)
  foreach(src IN LISTS sources)
    set(opts "")
    if(src MATCHES "_avx512\\.cpp$")
      set(opts ${METRO_AVX512_FLAGS})
    elseif(src MATCHES "_avx2\\.cpp$")
      set(opts ${METRO_AVX2_FLAGS})
    endif()
    if(src MATCHES "/src/(kernels|backends/cpu|model)/")
      list(APPEND opts ${METRO_SAN_HOT_FLAGS})
    endif()
    if(opts)
      set_source_files_properties(${src} PROPERTIES COMPILE_OPTIONS "${opts}")
    endif()
  endforeach()
endfunction()

# Test code itself does no heavy numerics (the references it checks against live in the
# library): -O1 compiles it in two thirds of the time.
function(metro_test_flags target)
  target_compile_options(${target} PRIVATE "$<$<COMPILE_LANGUAGE:CXX>:-O1>")
endfunction()
