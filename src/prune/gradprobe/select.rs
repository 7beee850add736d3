//! GradProbe's bookkeeping without a copy of the model: which weights are
//! tentatively pruned (step 1), the original gradient magnitudes kept only at
//! those positions, in f16 with a power-of-two scale per tensor (step 2), and
//! the decision rule (step 5).
//!
//! Positions are flat indices into a tensor in PyTorch orientation
//! (`[out, in]` for a linear, `[vocab, hidden]` for the embedding), sorted.

use half::f16;

/// How tentative candidates are ranked.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Strategy {
    /// |W| (the reference's `MagnitudePruning`).
    Magnitude,
    /// |W| · activation norm of the input column (the reference's
    /// `WANDAPruning` importance).
    Wanda,
}

impl std::str::FromStr for Strategy {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.to_ascii_lowercase().as_str() {
            "magnitude" => Ok(Strategy::Magnitude),
            "wanda" => Ok(Strategy::Wanda),
            other => Err(format!(
                "unknown strategy '{other}' (expected magnitude or wanda)"
            )),
        }
    }
}

impl std::fmt::Display for Strategy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Strategy::Magnitude => "magnitude",
            Strategy::Wanda => "wanda",
        })
    }
}

/// How the original gradient magnitudes are stored between the two passes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum GradPrecision {
    /// f16 scaled by a power of two per tensor: 2 bytes per candidate.
    F16,
    /// f32: 4 bytes per candidate, decisions bit-exact with an f32 run.
    F32,
}

impl std::str::FromStr for GradPrecision {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.to_ascii_lowercase().as_str() {
            "f16" => Ok(GradPrecision::F16),
            "f32" => Ok(GradPrecision::F32),
            other => Err(format!(
                "unknown gradient precision '{other}' (expected f16 or f32)"
            )),
        }
    }
}

/// Number of candidates at `sparsity` of `n` weights: `round(sparsity·n)`
/// with ties to even, as `torch.nn.utils.prune.l1_unstructured` computes it.
pub fn candidate_count(sparsity: f64, n: usize) -> usize {
    ((sparsity * n as f64).round_ties_even() as usize).min(n)
}

/// The `k` positions of smallest `importance(i)` for `i < n`, sorted by
/// position; equal importances are taken in index order. Importances are
/// computed on demand (no `n`-long importance vector: only the index
/// vector, trimmed to `k` at once).
pub fn smallest_by(n: usize, k: usize, importance: impl Fn(usize) -> f32) -> Vec<u32> {
    if k == 0 || n == 0 {
        return Vec::new();
    }
    let mut idx: Vec<u32> = (0..n as u32).collect();
    if k < n {
        let key = |i: &u32| (importance(*i as usize), *i);
        idx.select_nth_unstable_by(k - 1, |a, b| {
            key(a)
                .partial_cmp(&key(b))
                .unwrap_or(std::cmp::Ordering::Equal)
        });
        idx.truncate(k);
        // Give back the other n - k slots: candidates are kept for the run.
        idx.shrink_to_fit();
    }
    idx.sort_unstable();
    idx
}

/// Tentative candidates of one tensor `[rows, cols]` (PyTorch orientation).
/// `norms` (one per column) makes the importance |W|·norm (Wanda-style).
pub fn tentative(weight: &[f32], cols: usize, norms: Option<&[f32]>, sparsity: f64) -> Vec<u32> {
    let k = candidate_count(sparsity, weight.len());
    match norms {
        Some(n) if n.len() == cols && cols > 0 => {
            smallest_by(weight.len(), k, |i| weight[i].abs() * n[i % cols])
        }
        _ => smallest_by(weight.len(), k, |i| weight[i].abs()),
    }
}

/// The element-wise max of `|grad|` gathered at `positions`, folded into `acc`.
pub fn fold_max(acc: &mut [f32], grad: &[f32], positions: &[u32]) {
    for (a, p) in acc.iter_mut().zip(positions) {
        let g = grad[*p as usize].abs();
        if g > *a {
            *a = g;
        }
    }
}

/// Original gradient magnitudes at one tensor's candidates.
#[derive(Debug, Clone)]
pub enum StoredGrads {
    F32(Vec<f32>),
    /// Values are `f16 · 2^exp`.
    F16 {
        values: Vec<f16>,
        exp: i32,
    },
}

impl StoredGrads {
    /// Compresses `values` (all ≥ 0). In f16, the scale maps the largest
    /// value to [2^15, 2^16): nothing overflows, and a value underflows to
    /// zero only when it is below 2^-40 of the largest (f16 subnormals reach
    /// 2^-24). Exact zeros stay zero, so a weight whose gradient is exactly
    /// zero before and after still ties (0 ≤ 0: pruned) as in f32.
    pub fn store(values: Vec<f32>, precision: GradPrecision) -> Self {
        match precision {
            GradPrecision::F32 => StoredGrads::F32(values),
            GradPrecision::F16 => {
                let max = values.iter().fold(0f32, |m, v| m.max(*v));
                let exp = if max > 0.0 && max.is_finite() {
                    max.log2().floor() as i32 - 15
                } else {
                    0
                };
                let inv = (-exp as f32).exp2();
                let values = values.iter().map(|v| f16::from_f32(v * inv)).collect();
                StoredGrads::F16 { values, exp }
            }
        }
    }

    pub fn len(&self) -> usize {
        match self {
            StoredGrads::F32(v) => v.len(),
            StoredGrads::F16 { values, .. } => values.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The value at candidate `i`, as f32.
    pub fn get(&self, i: usize) -> f32 {
        match self {
            StoredGrads::F32(v) => v[i],
            StoredGrads::F16 { values, exp } => values[i].to_f32() * (*exp as f32).exp2(),
        }
    }

    pub fn bytes(&self) -> u64 {
        match self {
            StoredGrads::F32(v) => v.len() as u64 * 4,
            StoredGrads::F16 { values, .. } => values.len() as u64 * 2,
        }
    }
}

/// Step 5: the candidates whose gradient did not rise more than `threshold`
/// (relative): `modified ≤ original × (1 + threshold)`, in f32 as the
/// reference compares them. The list is held to the end of the pass for
/// every probed tensor, so it is shrunk to its length (a filtered collect
/// grows by doubling: 14.6 MiB of spare capacity over SmolLM2's 39.6 MiB
/// of positions).
pub fn decide(
    positions: &[u32],
    original: &StoredGrads,
    modified: &[f32],
    threshold: f64,
) -> Vec<u32> {
    let factor = (1.0 + threshold) as f32;
    let mut out: Vec<u32> = positions
        .iter()
        .enumerate()
        .filter(|(i, _)| modified[*i] <= original.get(*i) * factor)
        .map(|(_, p)| *p)
        .collect();
    out.shrink_to_fit();
    out
}

/// Union of two sorted position lists, allocated to its exact length: an
/// `--iterative` run holds it through the next step (sized `a + b`, it
/// kept 36 MiB of spare capacity on SmolLM2 at 30%).
pub fn union(a: &[u32], b: &[u32]) -> Vec<u32> {
    let mut out = Vec::with_capacity(merged(a, b).count());
    out.extend(merged(a, b));
    out
}

/// The sorted positions of `a` and `b`, each once.
fn merged<'a>(a: &'a [u32], b: &'a [u32]) -> impl Iterator<Item = u32> + 'a {
    let (mut i, mut j) = (0, 0);
    std::iter::from_fn(move || {
        let next = match (a.get(i), b.get(j)) {
            (Some(x), Some(y)) if x == y => {
                i += 1;
                j += 1;
                *x
            }
            (Some(x), Some(y)) if x < y => {
                i += 1;
                *x
            }
            (Some(x), None) => {
                i += 1;
                *x
            }
            (_, Some(y)) => {
                j += 1;
                *y
            }
            (None, None) => return None,
        };
        Some(next)
    })
}

/// Sets `positions` of `values` to `factor × value` (0 prunes).
pub fn scale_at(values: &mut [f32], positions: &[u32], factor: f32) {
    for p in positions {
        let v = &mut values[*p as usize];
        *v = if factor == 0.0 { 0.0 } else { *v * factor };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_round_half_to_even_like_torch() {
        assert_eq!(candidate_count(0.5, 5), 2); // 2.5 → 2
        assert_eq!(candidate_count(0.5, 7), 4); // 3.5 → 4
        assert_eq!(candidate_count(0.1, 100), 10);
        assert_eq!(candidate_count(0.0, 100), 0);
    }

    #[test]
    fn smallest_takes_ties_in_index_order() {
        let imp = [3.0, 1.0, 1.0, 0.5, 1.0, 9.0];
        let smallest = |k| smallest_by(imp.len(), k, |i| imp[i]);
        assert_eq!(smallest(3), vec![1, 2, 3]);
        assert_eq!(smallest(6), vec![0, 1, 2, 3, 4, 5]);
        assert!(smallest(0).is_empty());
    }

    #[test]
    fn wanda_importance_uses_column_norms() {
        // Row-major [2, 2]: |w|·norm = [1·10, 2·1, 3·10, 4·1] = [10, 2, 30, 4].
        let w = [1.0, -2.0, 3.0, 4.0];
        assert_eq!(tentative(&w, 2, Some(&[10.0, 1.0]), 0.5), vec![1, 3]);
        assert_eq!(tentative(&w, 2, None, 0.5), vec![0, 1]);
    }

    #[test]
    fn f16_store_keeps_small_values_and_zeros() {
        let v = vec![3.0e-9, 0.0, 1.0e-15, 2.5e-9];
        let s = StoredGrads::store(v.clone(), GradPrecision::F16);
        assert_eq!(s.bytes(), 8);
        for (i, x) in v.iter().enumerate() {
            let got = s.get(i);
            assert!((got - x).abs() <= x * 1e-3 + 1e-30, "{i}: {got} vs {x}");
        }
        assert_eq!(s.get(1), 0.0);
        // Unscaled f16 would have flushed all of them to zero.
        assert_eq!(f16::from_f32(3.0e-9).to_f32(), 0.0);
    }

    #[test]
    fn decision_rule_and_union() {
        let orig = StoredGrads::store(vec![1.0, 1.0, 0.0, 2.0], GradPrecision::F32);
        let kept = decide(&[4, 7, 9, 12], &orig, &[3.0, 3.1, 0.0, 0.5], 2.0);
        assert_eq!(kept, vec![4, 9, 12]);
        assert_eq!(union(&[1, 4, 9], &[2, 4, 10]), vec![1, 2, 4, 9, 10]);
        let mut w = [1.0, 2.0, 3.0];
        scale_at(&mut w, &[0, 2], 0.1);
        assert_eq!(w, [0.1, 2.0, 0.3f32]);
    }
}
