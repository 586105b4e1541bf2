/*
 * npy_f32_trig.h -- numpy's float32 np.sin / np.cos, bit for bit.
 *
 * numpy does not call libm sinf/cosf for float32 arrays: on x86-64 CPUs with
 * AVX2+FMA3 its SIMD loop (umath/loops_trigonometric.dispatch.cpp) uses a
 * Cody-Waite range reduction and short minimax polynomials, falling back to
 * libm only for huge arguments.  Its results differ from glibc's in about 9%
 * of inputs, so envs whose gymnasium reference applies np.sin/np.cos to
 * float32 values use these scalar re-implementations instead.
 */
#ifndef ENVD_NPY_F32_TRIG_H
#define ENVD_NPY_F32_TRIG_H

#include <stddef.h>

float envd_npy_sinf(float x);
float envd_npy_cosf(float x);

/* out[i] = envd_npy_sinf(in[i]) (or cosf when cosine != 0), for tests. */
void envd_npy_sincosf_array(const float *in, float *out, size_t n, int cosine);

#endif /* ENVD_NPY_F32_TRIG_H */
