// The WQ digit-state sums of the VNNI decode GEMVs, written once for any vector width:
// resplit_gemv_avx512.cpp runs them on zmm (AVX-512 VNNI), resplit_gemv_avxvnni.cpp on
// ymm (AVX-VNNI). Include only from those files (internal linkage; each compiles its
// own copy with its own flags).
//
// A WQ byte holds five base-3 digits as a state u: the digit is d = (3u - u') / 256
// with u' = 3u mod 256 the next state. So 256 sum_i d_i x_i is a sum of whole-byte
// products (u < 256 times int8: exact in int32), with no digit extracted:
//  - int8 activations (prep_wq_q8, Z = false): 3 sum_i u_i x_i - sum_i u_{i+1} x_i
//    over i = 0..4 (10 products);
//  - z activations (prep_wq_z, Z = true): sum_j u_j z_j over the states u_0..u_5 with
//    z_j = 3 x_j - x_{j-1} prepared (x of 6 bits keeps |z| <= 124): 6 products.
#pragma once
#include "common/simd.h"

namespace rmoe {
namespace resplit {
namespace {

// One vector width's integer ops for wq_state_sums: type I, zero(), add8, add32, sub32,
// and dp(acc, u8, s8) = acc + the sum of 4 byte products per int32 lane (vpdpbusd).
// pfx: the width's intrinsic prefix (_mm256, _mm512).
#define RMOE_WQ_STATE_OPS(Name, Vec, pfx, zero_fn, dp_fn)                    \
  struct Name {                                                              \
    using I = Vec;                                                           \
    static RMOE_INLINE I zero() { return zero_fn(); }                        \
    static RMOE_INLINE I add8(I a, I b) { return pfx##_add_epi8(a, b); }     \
    static RMOE_INLINE I add32(I a, I b) { return pfx##_add_epi32(a, b); }   \
    static RMOE_INLINE I sub32(I a, I b) { return pfx##_sub_epi32(a, b); }   \
    static RMOE_INLINE I dp(I acc, I u, I s) { return dp_fn(acc, u, s); }    \
  };

// V: a struct of RMOE_WQ_STATE_OPS.
// xq: the S = 5 (int8) or 6 (z) activation registers of these blocks.
// -> per int32 lane, 256 * sum of digit x activation over its 4 weight bytes.
template <class V, bool Z>
RMOE_INLINE typename V::I wq_state_sums(typename V::I u, const typename V::I* xq) {
  using I = typename V::I;
  if constexpr (Z) {
    I A = V::dp(V::zero(), u, xq[0]), B = V::zero();  // two chains
    for (int i = 1; i < 6; ++i) {
      u = V::add8(u, V::add8(u, u));
      if (i & 1) B = V::dp(B, u, xq[i]);
      else A = V::dp(A, u, xq[i]);
    }
    return V::add32(A, B);
  } else {
    I P = V::zero(), Q = V::zero();
    for (int i = 0; i < 5; ++i) {
      const I un = V::add8(u, V::add8(u, u));
      P = V::dp(P, u, xq[i]);
      Q = V::dp(Q, un, xq[i]);
      u = un;
    }
    return V::sub32(V::add32(P, V::add32(P, P)), Q);
  }
}

}  // namespace
}  // namespace resplit
}  // namespace rmoe
