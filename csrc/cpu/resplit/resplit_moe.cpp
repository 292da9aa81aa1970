// Split execution of one MoE layer on the CPU (DESIGN.md section 2), in parallel
// passes: gate/up of every routed (token, expert) pair, silu(g)*u, down, and the
// router-weighted sum.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "ggml/ggml_kernels.h"
#include "resplit/resplit.h"
#include "common/threadpool.h"

namespace rmoe {
namespace resplit {

namespace {
// The layer's scratch, carved from one block allocated per call and left
// uninitialized: every element read is written first.
class Scratch {
 public:
  // Room for n elements of T; its offset in the block.
  template <class T>
  size_t add(size_t n) {
    const size_t o = used_;
    used_ += (n * sizeof(T) + 63) / 64 * 64;
    return o;
  }
  // The block for everything added (64-byte aligned).
  uint8_t* commit() {
    block_.reset(new uint8_t[used_ + 64]);
    return block_.get() + (64 - reinterpret_cast<uintptr_t>(block_.get()) % 64) % 64;
  }

 private:
  size_t used_ = 0;
  std::unique_ptr<uint8_t[]> block_;
};
}  // namespace

void moe_forward(const MoeWeights& w, const float* x, size_t T, size_t k, const int32_t* ids, const float* weights,
                 const int32_t* ncrit, float* out) {
  const size_t E = w.E, H = w.H, F = w.F;
  // Groups (expert, critical?) -> routed (token, slot) pairs in token order; each
  // group's rows are contiguous so an expert's row is decoded once per 4 tokens.
  // (A counting sort over the keys: one small array, whatever E is.)
  const size_t TK = T * k;
  std::vector<int64_t> first(2 * E + 1, 0), rows(TK);
  auto key = [&](size_t i) { return 2 * (size_t)ids[i] + ((int32_t)(i % k) < ncrit[i / k] ? 1 : 0); };
  for (size_t i = 0; i < TK; ++i) ++first[key(i) + 1];
  for (size_t g = 0; g < 2 * E; ++g) first[g + 1] += first[g];
  {
    std::vector<int64_t> fill(first.begin(), first.end() - 1);
    for (size_t i = 0; i < TK; ++i) rows[(size_t)fill[key(i)]++] = (int64_t)i;
  }
  std::vector<int32_t> gid;  // expert per group
  std::vector<int64_t> goff, gcnt;
  std::vector<char> crit(TK);  // per gathered row
  for (size_t g = 0; g < 2 * E; ++g) {
    const int64_t off = first[g], cnt = first[g + 1] - first[g];
    if (cnt == 0) continue;
    gid.push_back((int32_t)(g / 2)); goff.push_back(off); gcnt.push_back(cnt);
    std::fill(crit.begin() + off, crit.begin() + off + cnt, (char)(g & 1));
  }
  const size_t N = rows.size();
  // Groups of many tokens take the int8 GEMM where it runs (resplit_i8.cpp); the
  // others (all of decode) the per-row kernels, whose activations are prepared per
  // format. There, non-critical rows run WQ on z activations where they exist (every
  // one, whatever its group's size, so a row's result does not depend on the batch).
  // With the source file's experts, every critical group runs from them: on the GGUF int8
  // GEMV, or in the int8 GEMM where that is faster for them (i8_gemm_for_source).
  const bool i8 = i8_gemm_available(), zq = wq_z_acts(), src = w.from_source();
  // small: WQ on int8, critical, non-critical on int8, non-critical on z; big: critical, not
  // cid / bsid: critical from the source, on the GGUF int8 GEMV / in the int8 GEMM
  std::vector<int32_t> sid, scid, snid, zid, bcid, bnid, cid, bsid;
  std::vector<int64_t> soff, scnt, scoff, sccnt, snoff, sncnt, zoff, zcnt, bcoff, bccnt, bnoff, bncnt, coff, ccnt, bsoff,
      bscnt;
  std::vector<char> rbig(N, 0), rz(N, 0), rsrc(N, 0);  // per gathered row
  for (size_t g = 0; g < gid.size(); ++g) {
    auto add = [&](std::vector<int32_t>& id, std::vector<int64_t>& off, std::vector<int64_t>& cnt) {
      id.push_back(gid[g]); off.push_back(goff[g]); cnt.push_back(gcnt[g]);
    };
    const bool c = crit[(size_t)goff[g]] != 0;
    const bool big = i8 && gcnt[g] >= (int64_t)kI8MinTokens;
    if (src && c && !(big && i8_gemm_for_source())) {
      add(cid, coff, ccnt);
      std::fill(rsrc.begin() + goff[g], rsrc.begin() + goff[g] + gcnt[g], 1);
    } else if (big) {
      src && c ? add(bsid, bsoff, bscnt) : c ? add(bcid, bcoff, bccnt) : add(bnid, bnoff, bncnt);
      std::fill(rbig.begin() + goff[g], rbig.begin() + goff[g] + gcnt[g], 1);
    } else if (zq && !c) {
      add(zid, zoff, zcnt);
      std::fill(rz.begin() + goff[g], rz.begin() + goff[g] + gcnt[g], 1);
    } else {
      add(sid, soff, scnt);
      c ? add(scid, scoff, sccnt) : add(snid, snoff, sncnt);
    }
  }
  const bool any_small = !sid.empty(), any_z = !zid.empty(), any_big = !bcid.empty() || !bnid.empty() || !bsid.empty();
  const bool small_crit = !scid.empty(), any_src = !cid.empty();
  // the source's int8 activations: x for gate (and for up, when its layout differs), h for down
  const int lg = any_src ? ggml::q8_act_layout(w.gate_s.type, H) : -1;
  const int lu = any_src ? ggml::q8_act_layout(w.up_s.type, H) : -1;
  const int ld = any_src ? ggml::q8_act_layout(w.down_s.type, F) : -1;
  const size_t bg = any_src ? ggml::q8_act_row_bytes(lg, H) : 0, bd = any_src ? ggml::q8_act_row_bytes(ld, F) : 0;
  const size_t bu = any_src && lu != lg ? ggml::q8_act_row_bytes(lu, H) : 0;
  const size_t pq = prep_floats(Fmt::WQ, H), pr = prep_floats(Fmt::WR, H), pz = any_z ? prep_floats_wq_z(H) : 0;
  const size_t hq = prep_floats(Fmt::WQ, F), h4 = prep_floats(Fmt::D4, F), hz = any_z ? prep_floats_wq_z(F) : 0;
  const size_t nbH = (H + 31) / 32, nbF = (F + 31) / 32;
  const size_t abH = any_big ? i8_act_bytes(H) : 0, abF = any_big ? i8_act_bytes(F) : 0;
  Scratch scratch;
  const size_t oXQ = scratch.add<float>(any_small ? N * pq : 0), oXR = scratch.add<float>(small_crit ? N * pr : 0);
  const size_t oG = scratch.add<float>(N * F), oU = scratch.add<float>(N * F), oY = scratch.add<float>(N * H);
  const size_t oGR = scratch.add<float>(small_crit ? N * F : 0), oUR = scratch.add<float>(small_crit ? N * F : 0);
  const size_t oHQ = scratch.add<float>(any_small ? N * hq : 0), oH4 = scratch.add<float>(small_crit ? N * h4 : 0);
  const size_t oXS = scratch.add<float>(any_big ? T * nbH : 0), oHS = scratch.add<float>(any_big ? N * nbF : 0);
  const size_t oTQ = scratch.add<float>(any_small ? T * pq : 0), oTR = scratch.add<float>(small_crit ? T * pr : 0);
  const size_t oXZ = scratch.add<float>(N * pz), oTZ = scratch.add<float>(T * pz), oHZ = scratch.add<float>(N * hz);
  const size_t oXU = scratch.add<uint8_t>(T * abH), oHU = scratch.add<uint8_t>(N * abF);
  const size_t oSGt = scratch.add<uint8_t>(T * bg), oSUt = scratch.add<uint8_t>(T * bu);
  const size_t oSG = scratch.add<uint8_t>(N * bg), oSU = scratch.add<uint8_t>(N * bu);
  const size_t oSD = scratch.add<uint8_t>(N * bd);
  uint8_t* base = scratch.commit();
  auto at = [&](size_t o) { return reinterpret_cast<float*>(base + o); };
  float *XQ = at(oXQ), *XR = at(oXR), *G = at(oG), *U = at(oU), *Y = at(oY), *GR = at(oGR), *UR = at(oUR);
  float *HQ = at(oHQ), *H4 = at(oH4), *XS = at(oXS), *HS = at(oHS), *TQ = at(oTQ), *TR = at(oTR);
  float *XZ = at(oXZ), *TZ = at(oTZ), *HZ = at(oHZ);
  uint8_t *XU = base + oXU, *HU = base + oHU;
  uint8_t *SGt = base + oSGt, *SUt = base + oSUt, *SG = base + oSG, *SU = base + oSU, *SD = base + oSD;
  std::vector<int32_t> tok(N);
  for (size_t r = 0; r < N; ++r) tok[r] = (int32_t)(rows[r] / (int64_t)k);
  // 1. activations in the formats that will read them: prepared once per token, then
  //    copied to the token's gathered rows (a decode token feeds all k of its rows)
  parallel_for(T, [&](size_t b, size_t e, int) {
    for (size_t t = b; t < e; ++t) {
      if (any_small) prep_x(Fmt::WQ, x + t * H, H, &TQ[t * pq]);
      if (small_crit) prep_x(Fmt::WR, x + t * H, H, &TR[t * pr]);
      if (any_z) prep_wq_z(x + t * H, H, &TZ[t * pz]);
      if (any_big) prep_i8(x + t * H, H, &XU[t * abH], &XS[t * nbH]);
      if (any_src) ggml::q8_act_quantize(lg, x + t * H, H, 1, SGt + t * bg, bg);
      if (bu) ggml::q8_act_quantize(lu, x + t * H, H, 1, SUt + t * bu, bu);
    }
  }, 4);
  for (size_t r = 0; r < N; ++r) {
    if (rsrc[r]) {
      std::memcpy(SG + r * bg, SGt + (size_t)tok[r] * bg, bg);
      if (bu) std::memcpy(SU + r * bu, SUt + (size_t)tok[r] * bu, bu);
      continue;
    }
    if (rbig[r]) continue;
    if (rz[r]) {
      std::memcpy(&XZ[r * pz], &TZ[(size_t)tok[r] * pz], pz * sizeof(float));
      continue;
    }
    std::memcpy(&XQ[r * pq], &TQ[(size_t)tok[r] * pq], pq * sizeof(float));
    if (crit[r]) std::memcpy(&XR[r * pr], &TR[(size_t)tok[r] * pr], pr * sizeof(float));
  }
  // 2. gate/up: WQ for all, WR for the critical rows (into their own buffers); big
  //    critical groups get WQ + WR as one int8 product; critical rows from the source run
  //    its gate and up alone
  std::vector<GemmJob> jobs;
  auto src_job = [&](const SrcExperts& m, size_t out_dim, size_t in_dim, const uint8_t* xq, float* y) {
    GemmJob j{Fmt::WQ, m.w, out_dim, in_dim, cid.data(), coff.data(), ccnt.data(), cid.size(),
              reinterpret_cast<const float*>(xq), y, false};
    j.src_type = m.type, j.src_rb = m.rb;
    jobs.push_back(j);
  };
  if (any_src) {
    src_job(w.gate_s, F, H, SG, G);
    src_job(w.up_s, F, H, bu ? SU : SG, U);
  }
  if (any_small) {
    jobs.push_back({Fmt::WQ, w.gate_q, F, H, sid.data(), soff.data(), scnt.data(), sid.size(), XQ, G, false});
    jobs.push_back({Fmt::WQ, w.up_q, F, H, sid.data(), soff.data(), scnt.data(), sid.size(), XQ, U, false});
  }
  if (any_z) {
    jobs.push_back({Fmt::WQ, w.gate_q, F, H, zid.data(), zoff.data(), zcnt.data(), zid.size(), XZ, G, false, true});
    jobs.push_back({Fmt::WQ, w.up_q, F, H, zid.data(), zoff.data(), zcnt.data(), zid.size(), XZ, U, false, true});
  }
  if (small_crit) {
    jobs.push_back({Fmt::WR, w.gate_r, F, H, scid.data(), scoff.data(), sccnt.data(), scid.size(), XR, GR, false});
    jobs.push_back({Fmt::WR, w.up_r, F, H, scid.data(), scoff.data(), sccnt.data(), scid.size(), XR, UR, false});
  }
  run_jobs(jobs.data(), jobs.size());
  std::vector<I8Job> ij;
  auto i8job = [&](Fmt fa, const uint8_t* Wa, Fmt fb, const uint8_t* Wb, size_t out_dim, size_t in_dim,
                   const std::vector<int32_t>& id, const std::vector<int64_t>& off, const std::vector<int64_t>& cnt,
                   const int32_t* xrow, const uint8_t* xq, const float* sx, float* y) {
    if (!id.empty()) ij.push_back({fa, Wa, fb, Wb, out_dim, in_dim, id.data(), off.data(), cnt.data(), id.size(), xrow, xq, sx, y});
  };
  i8job(Fmt::WQ, w.gate_q, Fmt::WR, w.gate_r, F, H, bcid, bcoff, bccnt, tok.data(), XU, XS, G);
  i8job(Fmt::WQ, w.up_q, Fmt::WR, w.up_r, F, H, bcid, bcoff, bccnt, tok.data(), XU, XS, U);
  i8job(Fmt::WQ, w.gate_q, Fmt::WQ, nullptr, F, H, bnid, bnoff, bncnt, tok.data(), XU, XS, G);
  i8job(Fmt::WQ, w.up_q, Fmt::WQ, nullptr, F, H, bnid, bnoff, bncnt, tok.data(), XU, XS, U);
  auto src_i8 = [&](const SrcExperts& m, size_t out_dim, size_t in_dim, const int32_t* xrow, const uint8_t* xq,
                    const float* sx, float* y) {
    if (bsid.empty()) return;
    ij.push_back({Fmt::WQ, m.w, Fmt::WQ, nullptr, out_dim, in_dim, bsid.data(), bsoff.data(), bscnt.data(), bsid.size(),
                  xrow, xq, sx, y});
    ij.back().src_type = m.type, ij.back().src_rb = m.rb;
  };
  src_i8(w.gate_s, F, H, tok.data(), XU, XS, G);
  src_i8(w.up_s, F, H, tok.data(), XU, XS, U);
  run_i8_jobs(ij.data(), ij.size());
  // 3. h = silu(g) * u, prepared for the down format of its row
  parallel_for(N, [&](size_t b, size_t e, int) {
    std::vector<float> hrow(F);
    for (size_t r = b; r < e; ++r) {
      float *g = &G[r * F], *u = &U[r * F];
      if (rsrc[r]) {
        silu_mul(g, u, F, hrow.data());
        ggml::q8_act_quantize(ld, hrow.data(), F, 1, SD + r * bd, bd);
        continue;
      }
      if (crit[r] && !rbig[r])
        for (size_t i = 0; i < F; ++i) { g[i] += GR[r * F + i]; u[i] += UR[r * F + i]; }
      silu_mul(g, u, F, hrow.data());
      if (rbig[r]) prep_i8(hrow.data(), F, &HU[r * abF], &HS[r * nbF]);
      else if (rz[r]) prep_wq_z(hrow.data(), F, &HZ[r * hz]);
      else if (crit[r]) prep_x(Fmt::D4, hrow.data(), F, &H4[r * h4]);
      else prep_x(Fmt::WQ, hrow.data(), F, &HQ[r * hq]);
    }
  }, 16);
  // 4. down: D4 for critical rows (the source's down where they run from it), WQ for the
  //    others (z where gate/up were)
  jobs.clear();
  if (any_src) src_job(w.down_s, H, F, SD, Y);
  if (small_crit) jobs.push_back({Fmt::D4, w.down4, H, F, scid.data(), scoff.data(), sccnt.data(), scid.size(), H4, Y, false});
  if (!snid.empty()) jobs.push_back({Fmt::WQ, w.down_q, H, F, snid.data(), snoff.data(), sncnt.data(), snid.size(), HQ, Y, false});
  if (any_z) jobs.push_back({Fmt::WQ, w.down_q, H, F, zid.data(), zoff.data(), zcnt.data(), zid.size(), HZ, Y, false, true});
  run_jobs(jobs.data(), jobs.size());
  ij.clear();
  i8job(Fmt::D4, w.down4, Fmt::D4, nullptr, H, F, bcid, bcoff, bccnt, nullptr, HU, HS, Y);
  i8job(Fmt::WQ, w.down_q, Fmt::WQ, nullptr, H, F, bnid, bnoff, bncnt, nullptr, HU, HS, Y);
  src_i8(w.down_s, H, F, nullptr, HU, HS, Y);
  run_i8_jobs(ij.data(), ij.size());
  // 5. router-weighted sum, split over columns so the row order (and result) is fixed
  parallel_for(H, [&](size_t c0, size_t c1, int) {
    for (size_t t = 0; t < T; ++t) std::memset(out + t * H + c0, 0, (c1 - c0) * sizeof(float));
    for (size_t r = 0; r < N; ++r) {
      const size_t t = (size_t)tok[r];
      const float wt = weights[rows[r]];
      for (size_t c = c0; c < c1; ++c) out[t * H + c] += wt * Y[r * H + c];
    }
  }, T == 1 ? H : 256);  // a decode token's sum is too small to share
}

void residual_forward(const MoeWeights& w, const float* x, size_t T, size_t n, const int32_t* tok, const int32_t* ids,
                      const float* weights, const float* gq, const float* uq, float* out) {
  const size_t E = w.E, H = w.H, F = w.F;
  // slots grouped by expert, in slot order within a group: each expert's residual rows are
  // decoded once per 4 of its tokens
  std::vector<int64_t> first(E + 1, 0), rows(n);
  for (size_t i = 0; i < n; ++i) ++first[(size_t)ids[i] + 1];
  for (size_t e = 0; e < E; ++e) first[e + 1] += first[e];
  {
    std::vector<int64_t> fill(first.begin(), first.end() - 1);
    for (size_t i = 0; i < n; ++i) rows[(size_t)fill[(size_t)ids[i]]++] = (int64_t)i;
  }
  std::vector<int32_t> gid;
  std::vector<int64_t> goff, gcnt;
  for (size_t e = 0; e < E; ++e)
    if (first[e + 1] > first[e]) gid.push_back((int32_t)e), goff.push_back(first[e]), gcnt.push_back(first[e + 1] - first[e]);
  const size_t pr = prep_floats(Fmt::WR, H), h4 = prep_floats(Fmt::D4, F);
  Scratch scratch;
  const size_t oTR = scratch.add<float>(T * pr), oXR = scratch.add<float>(n * pr), oGR = scratch.add<float>(n * F);
  const size_t oUR = scratch.add<float>(n * F), oH4 = scratch.add<float>(n * h4), oY = scratch.add<float>(n * H);
  uint8_t* base = scratch.commit();
  auto at = [&](size_t o) { return reinterpret_cast<float*>(base + o); };
  float *TR = at(oTR), *XR = at(oXR), *GR = at(oGR), *UR = at(oUR), *H4 = at(oH4), *Y = at(oY);
  parallel_for(T, [&](size_t b, size_t e, int) {
    for (size_t t = b; t < e; ++t) prep_x(Fmt::WR, x + t * H, H, &TR[t * pr]);
  }, 4);
  for (size_t r = 0; r < n; ++r) std::memcpy(&XR[r * pr], &TR[(size_t)tok[rows[r]] * pr], pr * sizeof(float));
  GemmJob jobs[2] = {{Fmt::WR, w.gate_r, F, H, gid.data(), goff.data(), gcnt.data(), gid.size(), XR, GR, false},
                     {Fmt::WR, w.up_r, F, H, gid.data(), goff.data(), gcnt.data(), gid.size(), XR, UR, false}};
  run_jobs(jobs, 2);
  parallel_for(n, [&](size_t b, size_t e, int) {
    std::vector<float> g(F), u(F), h(F);
    for (size_t r = b; r < e; ++r) {
      const size_t i = (size_t)rows[r];
      for (size_t j = 0; j < F; ++j) g[j] = gq[i * F + j] + GR[r * F + j], u[j] = uq[i * F + j] + UR[r * F + j];
      silu_mul(g.data(), u.data(), F, h.data());
      prep_x(Fmt::D4, h.data(), F, &H4[r * h4]);
    }
  }, 16);
  GemmJob down{Fmt::D4, w.down4, H, F, gid.data(), goff.data(), gcnt.data(), gid.size(), H4, Y, false};
  run_jobs(&down, 1);
  parallel_for(H, [&](size_t c0, size_t c1, int) {
    for (size_t t = 0; t < T; ++t) std::memset(out + t * H + c0, 0, (c1 - c0) * sizeof(float));
    for (size_t r = 0; r < n; ++r) {
      const size_t t = (size_t)tok[rows[r]];
      const float wt = weights[rows[r]];
      for (size_t c = c0; c < c1; ++c) out[t * H + c] += wt * Y[r * H + c];
    }
  }, T == 1 ? H : 256);
}

}  // namespace resplit
}  // namespace rmoe
