/*
 * Scalar re-implementation of numpy's float32 sin/cos SIMD kernel (the
 * AVX2/FMA3 build of umath/loops_trigonometric.dispatch.cpp, numpy 2.x), after
 * the algorithm of https://stackoverflow.com/questions/30463616:
 *
 *   1. q = rint(x * 2/pi), done with the 1.5*2^23 add/subtract trick;
 *   2. r = x - q*pi/2 with pi/2 split into three floats (Cody-Waite), each
 *      step one fused multiply-add;
 *   3. evaluate both the sine and cosine polynomials of r (Horner, one fused
 *      multiply-add per term) and pick one by the quadrant q (q+1 for cos);
 *   4. negate as 0 - p in quadrants 2 and 3.
 *
 * Every numpy MulAdd is an fmaf() here.  One more multiply-add is fused in
 * numpy's binary although its source writes a separate Mul and Add: the
 * x * 2/pi + 1.5*2^23 of step 1 (evidently GCC contracted the intrinsics when
 * building numpy).  With it fused here too, all 2^32 float32 inputs match
 * numpy 2.4 bit for bit; rounding x * 2/pi separately instead leaves a few
 * mismatches per 10^4 inputs with |x| > ~1e4, at quadrant boundaries.
 * All other operations round separately (this file is built with
 * -ffp-contract=off).  Arguments beyond the range where the reduction is
 * accurate go to libm as in numpy; NaN inputs give numpy's positive quiet NaN.
 */
#include <math.h>

#include "npy_f32_trig.h"

/* |x| above these goes to libm (the three-float pi/2 loses accuracy). */
#define SIN_MAX_CODY_WAITE 117435.992f
#define COS_MAX_CODY_WAITE 71476.0625f

#define TWO_OVER_PI 0x1.45f306p-1f
#define NEG_PIO2_HIGH -0x1.921fb0p+00f
#define NEG_PIO2_MED -0x1.5110b4p-22f
#define NEG_PIO2_LOW -0x1.846988p-48f
/* Adding then subtracting 1.5*2^23 rounds |v| <= 2^22 to the nearest integer. */
#define RINT_MAGIC 0x1.800000p+23f

/* cos(r) for |r| <= pi/4 as a polynomial in r2 = r*r. */
static float cos_poly(float r2)
{
    float p = fmaf(0x1.98e616p-16f, r2, -0x1.6c06dcp-10f);
    p = fmaf(p, r2, 0x1.55553cp-05f);
    p = fmaf(p, r2, -0x1.000000p-01f);
    return fmaf(p, r2, 0x1.000000p+00f);
}

/* sin(r) for |r| <= pi/4 as r + r*r2*P(r2). */
static float sin_poly(float r, float r2)
{
    float p = fmaf(0x1.7d3bbcp-19f, r2, -0x1.a06bbap-13f);
    p = fmaf(p, r2, 0x1.11119ap-07f);
    p = fmaf(p, r2, -0x1.555556p-03f);
    /* numpy multiplies by r2 as a fused add of +0, which maps -0 to +0. */
    p = fmaf(p, r2, 0.0f);
    return fmaf(p, r, r);
}

/* The in-range kernel; quadrant_offset is 0 for sin and 1 for cos. */
static float sincos_reduced(float x, int quadrant_offset)
{
    /* Fused as in numpy's binary (see the top of this file). */
    float q = fmaf(x, TWO_OVER_PI, RINT_MAGIC);
    q = q - RINT_MAGIC;

    float r = fmaf(q, NEG_PIO2_HIGH, x);
    r = fmaf(q, NEG_PIO2_MED, r);
    r = fmaf(q, NEG_PIO2_LOW, r);
    float r2 = r * r;

    /* Both polynomials are evaluated in numpy too; only one is kept. */
    float c = cos_poly(r2);
    float s = sin_poly(r, r2);

    int quadrant = (int)q + quadrant_offset;
    float p = (quadrant & 1) == 0 ? s : c;
    /* numpy negates by subtracting from +0, so a zero result stays +0. */
    return (quadrant & 2) != 0 ? 0.0f - p : p;
}

float envd_npy_sinf(float x)
{
    if (isnan(x))
        return NAN;
    if (!(fabsf(x) <= SIN_MAX_CODY_WAITE))
        return sinf(x);
    return sincos_reduced(x, 0);
}

float envd_npy_cosf(float x)
{
    if (isnan(x))
        return NAN;
    if (!(fabsf(x) <= COS_MAX_CODY_WAITE))
        return cosf(x);
    return sincos_reduced(x, 1);
}

void envd_npy_sincosf_array(const float *in, float *out, size_t n, int cosine)
{
    for (size_t i = 0; i < n; i++)
        out[i] = cosine ? envd_npy_cosf(in[i]) : envd_npy_sinf(in[i]);
}
