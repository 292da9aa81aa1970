// Split execution of one MoE layer on the CPU (DESIGN.md section 2), in four
// parallel passes: gate/up of every routed (token, expert) pair, silu(g)*u,
// down, and the router-weighted sum.
#include <cmath>
#include <cstring>
#include <vector>

#include "resplit.h"
#include "threadpool.h"

namespace rmoe {
namespace resplit {

void moe_forward(const MoeWeights& w, const float* x, size_t T, size_t k, const int32_t* ids, const float* weights,
                 const int32_t* ncrit, float* out) {
  const size_t E = w.E, H = w.H, F = w.F;
  // Groups (expert, critical?) -> routed (token, slot) pairs in token order; each
  // group's rows are contiguous so an expert's row is decoded once per 4 tokens.
  std::vector<std::vector<int64_t>> members(2 * E);
  for (size_t t = 0; t < T; ++t)
    for (size_t j = 0; j < k; ++j) members[2 * (size_t)ids[t * k + j] + ((int32_t)j < ncrit[t] ? 1 : 0)].push_back((int64_t)(t * k + j));
  std::vector<int32_t> gid, cid, nid;  // expert per group: all, critical, non-critical
  std::vector<int64_t> goff, gcnt, coff, ccnt, noff, ncnt, rows;
  std::vector<char> crit;              // per gathered row
  for (size_t g = 0; g < 2 * E; ++g) {
    if (members[g].empty()) continue;
    const int32_t e = (int32_t)(g / 2);
    const int64_t off = (int64_t)rows.size(), cnt = (int64_t)members[g].size();
    gid.push_back(e); goff.push_back(off); gcnt.push_back(cnt);
    if (g & 1) { cid.push_back(e); coff.push_back(off); ccnt.push_back(cnt); }
    else { nid.push_back(e); noff.push_back(off); ncnt.push_back(cnt); }
    rows.insert(rows.end(), members[g].begin(), members[g].end());
    crit.insert(crit.end(), (size_t)cnt, (char)(g & 1));
  }
  const size_t N = rows.size();
  const bool any_crit = !cid.empty();
  const size_t pq = prep_floats(Fmt::WQ, H), pr = prep_floats(Fmt::WR, H);
  const size_t hq = prep_floats(Fmt::WQ, F), h4 = prep_floats(Fmt::D4, F);
  std::vector<float> XQ(N * pq), XR(any_crit ? N * pr : 0), G(N * F), U(N * F);
  std::vector<float> GR(any_crit ? N * F : 0), UR(any_crit ? N * F : 0);
  std::vector<float> HQ(N * hq), H4(any_crit ? N * h4 : 0), Y(N * H);
  // 1. activations in the formats that will read them: prepared once per token, then
  //    copied to the token's gathered rows (a decode token feeds all k of its rows)
  std::vector<float> TQ(T * pq), TR(any_crit ? T * pr : 0);
  parallel_for(T, [&](size_t b, size_t e, int) {
    for (size_t t = b; t < e; ++t) {
      prep_x(Fmt::WQ, x + t * H, H, &TQ[t * pq]);
      if (any_crit) prep_x(Fmt::WR, x + t * H, H, &TR[t * pr]);
    }
  }, 4);
  for (size_t r = 0; r < N; ++r) {
    const size_t t = (size_t)(rows[r] / (int64_t)k);
    std::memcpy(&XQ[r * pq], &TQ[t * pq], pq * sizeof(float));
    if (crit[r]) std::memcpy(&XR[r * pr], &TR[t * pr], pr * sizeof(float));
  }
  // 2. gate/up: WQ for all, WR for the critical rows (into their own buffers)
  std::vector<GemmJob> jobs = {
      {Fmt::WQ, w.gate_q, F, H, gid.data(), goff.data(), gcnt.data(), gid.size(), XQ.data(), G.data(), false},
      {Fmt::WQ, w.up_q, F, H, gid.data(), goff.data(), gcnt.data(), gid.size(), XQ.data(), U.data(), false}};
  if (any_crit) {
    jobs.push_back({Fmt::WR, w.gate_r, F, H, cid.data(), coff.data(), ccnt.data(), cid.size(), XR.data(), GR.data(), false});
    jobs.push_back({Fmt::WR, w.up_r, F, H, cid.data(), coff.data(), ccnt.data(), cid.size(), XR.data(), UR.data(), false});
  }
  run_jobs(jobs.data(), jobs.size());
  // 3. h = silu(g) * u, prepared for the down format of its row
  parallel_for(N, [&](size_t b, size_t e, int) {
    std::vector<float> hrow(F);
    for (size_t r = b; r < e; ++r) {
      for (size_t i = 0; i < F; ++i) {
        const float g = crit[r] ? G[r * F + i] + GR[r * F + i] : G[r * F + i];
        const float u = crit[r] ? U[r * F + i] + UR[r * F + i] : U[r * F + i];
        hrow[i] = g / (1.0f + std::exp(-g)) * u;
      }
      if (crit[r]) prep_x(Fmt::D4, hrow.data(), F, &H4[r * h4]);
      else prep_x(Fmt::WQ, hrow.data(), F, &HQ[r * hq]);
    }
  }, 16);
  // 4. down: D4 for critical rows, WQ for the others
  jobs.clear();
  if (any_crit) jobs.push_back({Fmt::D4, w.down4, H, F, cid.data(), coff.data(), ccnt.data(), cid.size(), H4.data(), Y.data(), false});
  if (!nid.empty()) jobs.push_back({Fmt::WQ, w.down_q, H, F, nid.data(), noff.data(), ncnt.data(), nid.size(), HQ.data(), Y.data(), false});
  run_jobs(jobs.data(), jobs.size());
  // 5. router-weighted sum, split over columns so the row order (and result) is fixed
  parallel_for(H, [&](size_t c0, size_t c1, int) {
    for (size_t t = 0; t < T; ++t) std::memset(out + t * H + c0, 0, (c1 - c0) * sizeof(float));
    for (size_t r = 0; r < N; ++r) {
      const size_t t = (size_t)(rows[r] / (int64_t)k);
      const float wt = weights[rows[r]];
      for (size_t c = c0; c < c1; ++c) out[t * H + c] += wt * Y[r * H + c];
    }
  }, 256);
}

}  // namespace resplit
}  // namespace rmoe
