/* fp8_round, shared by fp8.c and presets.c: round to a float format's grid, ties to even. */
#ifndef FC_ROUND_H
#define FC_ROUND_H
#include <math.h>
#include <stdint.h>
#include <string.h>

static inline double pow2d(int e) {
    uint64_t u = (uint64_t)(e + 1023) << 52;
    double d;
    memcpy(&d, &u, 8);
    return d;
}

/* y rounded to the nearest value of a float format with mbits mantissa bits and smallest normal exponent emin
   (ties to even), after a clamp at +-maxv (NaN passes the clamp and stays NaN); branch-free, so it vectorises */
static inline double fp8_round(double y, int mbits, int emin, double maxv) {
    y = y < -maxv ? -maxv : (y > maxv ? maxv : y);
    const double a = fabs(y);
    uint64_t u;
    memcpy(&u, &a, 8);
    int e = (int)(u >> 52) - 1023; /* floor(log2 a) for a normal a; a double subnormal or 0 reads -1023 */
    e = e < emin ? emin : e;
    const double r = rint(a * pow2d(mbits - e)) * pow2d(e - mbits); /* exact scalings; rint: nearest, even */
    return copysign(r, y);
}

#endif
