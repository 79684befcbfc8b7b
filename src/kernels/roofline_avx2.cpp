// The peak loops of roofline.h: twelve independent instructions a round on registers that
// never change, written in assembly so that the compiler can neither fold them nor add
// work between them. Twelve chains cover the latency (3-5 cycles) of two issues a cycle.
#include "kernels/roofline.h"

namespace metro::kernels {

// What both loops overwrite: the counter, the flags and ymm0-ymm13.
#define PEAK_LOOP_CLOBBERS                                                                                  \
  "rcx", "cc", "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10", "xmm11", \
      "xmm12", "xmm13"

void peak_loop_maddubs(int64_t iters) {
  __asm__ volatile(
      "vpxor %%ymm0, %%ymm0, %%ymm0\n\t"
      "vpxor %%ymm1, %%ymm1, %%ymm1\n\t"
      "mov %0, %%rcx\n\t"
      "1:\n\t"
      "vpmaddubsw %%ymm1, %%ymm0, %%ymm2\n\t"
      "vpmaddubsw %%ymm1, %%ymm0, %%ymm3\n\t"
      "vpmaddubsw %%ymm1, %%ymm0, %%ymm4\n\t"
      "vpmaddubsw %%ymm1, %%ymm0, %%ymm5\n\t"
      "vpmaddubsw %%ymm1, %%ymm0, %%ymm6\n\t"
      "vpmaddubsw %%ymm1, %%ymm0, %%ymm7\n\t"
      "vpmaddubsw %%ymm1, %%ymm0, %%ymm8\n\t"
      "vpmaddubsw %%ymm1, %%ymm0, %%ymm9\n\t"
      "vpmaddubsw %%ymm1, %%ymm0, %%ymm10\n\t"
      "vpmaddubsw %%ymm1, %%ymm0, %%ymm11\n\t"
      "vpmaddubsw %%ymm1, %%ymm0, %%ymm12\n\t"
      "vpmaddubsw %%ymm1, %%ymm0, %%ymm13\n\t"
      "dec %%rcx\n\t"
      "jnz 1b\n\t"
      "vzeroupper\n\t"
      :
      : "r"(iters)
      : PEAK_LOOP_CLOBBERS);
}

void peak_loop_fma(int64_t iters) {
  __asm__ volatile(
      "vxorps %%ymm0, %%ymm0, %%ymm0\n\t"
      "vxorps %%ymm1, %%ymm1, %%ymm1\n\t"
      "mov %0, %%rcx\n\t"
      "1:\n\t"
      "vfmadd231ps %%ymm1, %%ymm0, %%ymm2\n\t"
      "vfmadd231ps %%ymm1, %%ymm0, %%ymm3\n\t"
      "vfmadd231ps %%ymm1, %%ymm0, %%ymm4\n\t"
      "vfmadd231ps %%ymm1, %%ymm0, %%ymm5\n\t"
      "vfmadd231ps %%ymm1, %%ymm0, %%ymm6\n\t"
      "vfmadd231ps %%ymm1, %%ymm0, %%ymm7\n\t"
      "vfmadd231ps %%ymm1, %%ymm0, %%ymm8\n\t"
      "vfmadd231ps %%ymm1, %%ymm0, %%ymm9\n\t"
      "vfmadd231ps %%ymm1, %%ymm0, %%ymm10\n\t"
      "vfmadd231ps %%ymm1, %%ymm0, %%ymm11\n\t"
      "vfmadd231ps %%ymm1, %%ymm0, %%ymm12\n\t"
      "vfmadd231ps %%ymm1, %%ymm0, %%ymm13\n\t"
      "dec %%rcx\n\t"
      "jnz 1b\n\t"
      "vzeroupper\n\t"
      :
      : "r"(iters)
      : PEAK_LOOP_CLOBBERS);
}

#undef PEAK_LOOP_CLOBBERS

}  // namespace metro::kernels
