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

set(METRO_SAN_FLAGS "")
if(METRO_SANITIZE)
  set(METRO_SAN_FLAGS -fsanitize=address,undefined -fno-sanitize-recover=undefined
      -fno-omit-frame-pointer)
endif()
if(METRO_FUZZ)
  set(METRO_SAN_FLAGS -fsanitize=fuzzer-no-link,address,undefined
      -fno-sanitize-recover=undefined -fno-omit-frame-pointer)
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

# Gives SIMD files their instruction-set flags.
function(metro_simd_sources sources)
  foreach(src IN LISTS sources)
    if(src MATCHES "_avx512\\.cpp$")
      set_source_files_properties(${src} PROPERTIES COMPILE_OPTIONS "${METRO_AVX512_FLAGS}")
    elseif(src MATCHES "_avx2\\.cpp$")
      set_source_files_properties(${src} PROPERTIES COMPILE_OPTIONS "${METRO_AVX2_FLAGS}")
    endif()
  endforeach()
endfunction()
