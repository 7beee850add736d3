//! The selection kernels (`exec::kernels::select`, `group`) against a
//! stable sort on the host: the per-output `k` smallest and the N:M ranks
//! in both layouts a weight comes in, and the per-matrix threshold, over
//! keys with many ties and keys over every digit.

use super::*;

/// `keys` (`[rows, cols]`) on the device in both layouts a weight comes in
/// (`[in, out]` and its transpose), each through `kernel`, its mask
/// compared with `expected`: (case, positions that differ, kernel ran).
fn in_both_layouts<B: Compute>(
    keys: &[i32],
    (rows, cols): (usize, usize),
    device: &B::Device,
    expected: &[bool],
    case: &str,
    kernel: impl Fn(
        burn::prelude::Tensor<B, 2, burn::prelude::Int>,
    ) -> Option<burn::prelude::Tensor<B, 2, burn::prelude::Bool>>,
) -> Vec<(String, f64, bool)> {
    use burn::prelude::{Int, Tensor, TensorData};
    let mut t = vec![0i32; rows * cols];
    for r in 0..rows {
        for c in 0..cols {
            t[c * rows + r] = keys[r * cols + c];
        }
    }
    let straight =
        Tensor::<B, 2, Int>::from_data(TensorData::new(keys.to_vec(), [rows, cols]), device);
    let transposed =
        Tensor::<B, 2, Int>::from_data(TensorData::new(t, [cols, rows]), device).transpose();
    [("[rows, cols]", straight), ("transposed", transposed)]
        .into_iter()
        .map(|(layout, k)| {
            let (differ, ran) = match kernel(k) {
                Some(mask) => {
                    let got: Vec<bool> = mask.into_data().iter::<bool>().collect();
                    let differ = got.iter().zip(expected).filter(|(a, b)| a != b).count();
                    (differ as f64, true)
                }
                None => (f64::NAN, false),
            };
            (format!("{case} {layout}"), differ, ran)
        })
        .collect()
}

/// The N:M kernel against a stable sort of each group, in both layouts,
/// on the first 296 rows of `keys` (`[_, cols]`, heavy ties).
fn group_cases<B: Compute>(
    keys: &[i32],
    cols: usize,
    device: &B::Device,
) -> Vec<(String, f64, bool)> {
    let rows = 296;
    let keys = &keys[..rows * cols];
    let mut out = Vec::new();
    for (n, m) in [(2, 4), (4, 8), (1, 4)] {
        let mut expected = vec![false; rows * cols];
        for c in 0..cols {
            for g in (0..rows).step_by(m) {
                let mut order: Vec<usize> = (g..g + m).collect();
                order.sort_by_key(|&r| keys[r * cols + c]);
                for &r in &order[..n] {
                    expected[r * cols + c] = true;
                }
            }
        }
        out.extend(in_both_layouts::<B>(
            keys,
            (rows, cols),
            device,
            &expected,
            &format!("select {n}:{m}"),
            |k| B::smallest_per_group(k, n, m).ok(),
        ));
    }
    out
}

/// `n` keys over every digit of a non-negative i32: bf16-rounded f32
/// bits of `|w|` with magnitudes from 1e-30 to 1e30, every 97th
/// `i32::MAX`.
fn spread_keys(n: usize) -> Vec<i32> {
    prunemem::model::synthetic::Normal::new(13)
        .vec(n, 1.0)
        .iter()
        .enumerate()
        .map(|(i, v)| match i % 97 {
            0 => i32::MAX,
            _ => {
                let scale = 10f32.powi((i % 61) as i32 - 30);
                ((v.abs() * scale).to_bits() & 0xFFFF_0000) as i32
            }
        })
        .collect()
}

/// The per-output kernel's `k` smallest of every column of `keys`
/// (`[rows, cols]`) in both layouts, against a stable sort.
fn per_column_case<B: Compute>(
    keys: &[i32],
    (rows, cols): (usize, usize),
    k: usize,
    case: &str,
    device: &B::Device,
) -> Vec<(String, f64, bool)> {
    let mut expected = vec![false; rows * cols];
    for c in 0..cols {
        let mut order: Vec<usize> = (0..rows).collect();
        order.sort_by_key(|&r| keys[r * cols + c]);
        for &r in &order[..k] {
            expected[r * cols + c] = true;
        }
    }
    in_both_layouts::<B>(keys, (rows, cols), device, &expected, case, |t| {
        B::smallest_per_column(t, k).ok()
    })
}

/// Every selection case: (case, positions that differ or distance from the
/// host's key, kernel ran). Draws its tied keys from `rng`.
pub(super) fn cases<B: Compute>(
    rng: &mut prunemem::model::synthetic::Normal,
    device: &B::Device,
) -> Vec<(String, f64, bool)> {
    use burn::prelude::{Int, Tensor, TensorData};
    let mut out = Vec::new();
    let (rows, cols) = (300usize, 70usize);
    // Non-negative keys, a few hundred distinct values: ties everywhere.
    let keys: Vec<i32> = rng
        .vec(rows * cols, 1.0)
        .iter()
        .map(|v| ((v.abs() * 64.0).round() as i32) * 1000)
        .collect();
    for k in [1, 150, 299] {
        let case = format!("select k={k}");
        out.extend(per_column_case::<B>(&keys, (rows, cols), k, &case, device));
    }
    out.extend(group_cases::<B>(&keys, cols, device));
    // 21 000 keys: one cube; 400 000 (past 128 a unit of a 256-unit
    // cube): the radix passes spread over many cubes. The third set
    // spans every digit of the key: f32 bit patterns of |w| from
    // 1e-30 to 1e30, every 97th `i32::MAX` (GradProbe's positions
    // fill the others so), and bf16-rounded, so ties too.
    let wide: Vec<i32> = prunemem::model::synthetic::Normal::new(12)
        .vec(400 * 1000, 1.0)
        .iter()
        .map(|v| ((v.abs() * 64.0).round() as i32) * 1000 + 7)
        .collect();
    let spread = spread_keys(300 * 700);
    for (rows, cols) in [(300, 700), (700, 300)] {
        let k = rows / 3;
        let case = format!("select every digit {rows}x{cols} k={k}");
        out.extend(per_column_case::<B>(
            &spread,
            (rows, cols),
            k,
            &case,
            device,
        ));
    }
    for (keys, (rows, cols), ks) in [
        (&keys, (rows, cols), [1, 777, rows * cols]),
        (&wide, (400, 1000), [1, 123_457, 400_000]),
        (&spread, (300, 700), [1, 70_001, 210_000]),
    ] {
        let mut sorted = keys.clone();
        sorted.sort();
        for k in ks {
            let t =
                Tensor::<B, 2, Int>::from_data(TensorData::new(keys.clone(), [rows, cols]), device);
            let (miss, ran) = match B::kth_smallest(&t.transpose(), k) {
                Some(got) => {
                    let got = got.into_data().iter::<i64>().next().unwrap_or(-1);
                    ((got - sorted[k - 1] as i64).abs() as f64, true)
                }
                None => (f64::NAN, false),
            };
            out.push((format!("select kth of {} k={k}", rows * cols), miss, ran));
        }
    }
    out
}
