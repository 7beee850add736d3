//! Element types: what a checkpoint stores (F32, F16, BF16) and what a run
//! computes in, and the conversions between them.

use std::str::FromStr;

use burn::tensor::{DType, FloatDType, TensorData};
use half::{bf16, f16};
use safetensors::Dtype;

/// The float dtype of a runtime dtype (defaults to f32 for non-floats).
pub fn float_dtype(d: DType) -> FloatDType {
    match d {
        DType::F16 => FloatDType::F16,
        DType::BF16 => FloatDType::BF16,
        DType::F64 => FloatDType::F64,
        _ => FloatDType::F32,
    }
}

/// `t` in f32: itself where it is f32 already, else a cast copy.
pub fn to_f32<B: burn::tensor::backend::Backend, const D: usize>(
    t: burn::tensor::Tensor<B, D>,
) -> burn::tensor::Tensor<B, D> {
    match t.dtype() {
        DType::F32 => t,
        _ => t.cast(FloatDType::F32),
    }
}

/// The dtype a run computes in (`--dtype`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ComputeDtype {
    F32,
    F16,
    Bf16,
}

impl ComputeDtype {
    pub fn burn(self) -> DType {
        match self {
            ComputeDtype::F32 => DType::F32,
            ComputeDtype::F16 => DType::F16,
            ComputeDtype::Bf16 => DType::BF16,
        }
    }
    pub fn size(self) -> u64 {
        match self {
            ComputeDtype::F32 => 4,
            _ => 2,
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            ComputeDtype::F32 => "f32",
            ComputeDtype::F16 => "f16",
            ComputeDtype::Bf16 => "bf16",
        }
    }
}

impl FromStr for ComputeDtype {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.to_ascii_lowercase().as_str() {
            "f32" | "float32" | "fp32" => Ok(ComputeDtype::F32),
            "f16" | "float16" | "fp16" | "half" => Ok(ComputeDtype::F16),
            "bf16" | "bfloat16" => Ok(ComputeDtype::Bf16),
            _ => Err(format!("unknown dtype '{s}' (expected f32, f16 or bf16)")),
        }
    }
}

impl std::fmt::Display for ComputeDtype {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// True for the stored dtypes prunemem loads.
pub fn is_loadable(d: Dtype) -> bool {
    matches!(d, Dtype::F32 | Dtype::F16 | Dtype::BF16)
}

/// Bytes per element of a stored dtype.
pub fn stored_size(d: Dtype) -> usize {
    d.bitsize() / 8
}

/// Short lowercase name of a stored dtype (`f32`, `bf16`).
pub fn stored_name(d: Dtype) -> String {
    format!("{d:?}").to_ascii_lowercase()
}

/// Decodes little-endian stored elements to f32.
pub fn decode_f32(bytes: &[u8], d: Dtype) -> Vec<f32> {
    if !is_loadable(d) {
        return Vec::new();
    }
    let mut out = vec![0f32; bytes.len() / stored_size(d)];
    decode_into(bytes, d, &mut out);
    out
}

/// Index of the first NaN or infinity among little-endian stored elements,
/// read from the exponent bits alone (no decoding).
pub fn first_non_finite(bytes: &[u8], d: Dtype) -> Option<usize> {
    match d {
        Dtype::F32 => bytes.chunks_exact(4).position(|c| {
            u32::from_le_bytes([c[0], c[1], c[2], c[3]]) & 0x7f80_0000 == 0x7f80_0000
        }),
        Dtype::F16 => bytes
            .chunks_exact(2)
            .position(|c| u16::from_le_bytes([c[0], c[1]]) & 0x7c00 == 0x7c00),
        Dtype::BF16 => bytes
            .chunks_exact(2)
            .position(|c| u16::from_le_bytes([c[0], c[1]]) & 0x7f80 == 0x7f80),
        _ => None,
    }
}

/// Encodes f32 values in a stored dtype (round to nearest even).
pub fn encode_f32(values: &[f32], d: Dtype) -> Vec<u8> {
    match d {
        Dtype::F16 => values
            .iter()
            .flat_map(|v| f16::from_f32(*v).to_le_bytes())
            .collect(),
        Dtype::BF16 => values
            .iter()
            .flat_map(|v| bf16::from_f32(*v).to_le_bytes())
            .collect(),
        _ => values.iter().flat_map(|v| v.to_le_bytes()).collect(),
    }
}

/// Elements per piece of [`convert_parallel`] (1 Mi): one rayon task.
const PIECE: usize = 1 << 20;

/// Elements a piece decodes to f32 at a time (16 KiB on the stack) before
/// converting them as a slice.
const STRIP: usize = 4096;

/// `src`'s little-endian stored elements (F32, F16 or BF16) as f32 in
/// `dst`, one loop per stored dtype.
fn decode_into(src: &[u8], d: Dtype, dst: &mut [f32]) {
    match d {
        Dtype::F16 => {
            for (v, c) in dst.iter_mut().zip(src.chunks_exact(2)) {
                *v = f16::from_le_bytes([c[0], c[1]]).to_f32();
            }
        }
        Dtype::BF16 => {
            // The bits moved up: the same value as `bf16::to_f32` for
            // every number (a NaN keeps its payload; every caller rejects
            // NaN), without its branch: the table's conversion took
            // 0.45-0.62 s with the branch, 0.32-0.53 s without (six runs
            // each, `examples/reader_rate.rs`).
            for (v, c) in dst.iter_mut().zip(src.chunks_exact(2)) {
                *v = f32::from_bits((u16::from_le_bytes([c[0], c[1]]) as u32) << 16);
            }
        }
        _ => {
            for (v, c) in dst.iter_mut().zip(src.chunks_exact(4)) {
                *v = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
            }
        }
    }
}

/// An element a run computes in, written from f32 values a slice at a
/// time (`half`'s vector instructions where the CPU has them).
trait Target: burn::tensor::Element + bytemuck::Zeroable {
    fn encode(src: &[f32], dst: &mut [Self]);
}

impl Target for f32 {
    fn encode(src: &[f32], dst: &mut [Self]) {
        dst.copy_from_slice(src);
    }
}

impl Target for f16 {
    fn encode(src: &[f32], dst: &mut [Self]) {
        half::slice::HalfFloatSliceExt::convert_from_f32_slice(dst, src);
    }
}

impl Target for bf16 {
    fn encode(src: &[f32], dst: &mut [Self]) {
        half::slice::HalfFloatSliceExt::convert_from_f32_slice(dst, src);
    }
}

/// `bytes` converted to `T` piece by piece on every core, into an output
/// zeroed by the allocator (no pass of its own): [`par_convert_into`].
fn par_convert<T: Target>(bytes: &[u8], stored: Dtype) -> Result<Vec<T>, usize> {
    let width = stored_size(stored).max(1);
    let mut out = bytemuck::allocation::zeroed_vec::<T>(bytes.len() / width);
    par_convert_into(bytes, stored, &mut out, PIECE)?;
    Ok(out)
}

/// `bytes` converted into `out` (one element each) on every core, `piece`
/// elements a task: each strip decoded to f32, checked, then encoded as a
/// slice. `Err(i)`: element `i` is the first not finite.
fn par_convert_into<T: Target>(
    bytes: &[u8],
    stored: Dtype,
    out: &mut [T],
    piece: usize,
) -> Result<(), usize> {
    use rayon::prelude::*;
    let width = stored_size(stored).max(1);
    let bad = out
        .par_chunks_mut(piece)
        .zip(bytes.par_chunks(piece * width))
        .enumerate()
        .filter_map(|(k, (dst, src))| {
            let mut strip = [0f32; STRIP];
            let pieces = dst.chunks_mut(STRIP).zip(src.chunks(STRIP * width));
            for (j, (d, s)) in pieces.enumerate() {
                let f = &mut strip[..d.len()];
                decode_into(s, stored, f);
                if let Some(i) = f.iter().position(|v| !v.is_finite()) {
                    return Some(k * piece + j * STRIP + i);
                }
                T::encode(f, d);
            }
            None
        })
        .min();
    match bad {
        Some(i) => Err(i),
        None => Ok(()),
    }
}

/// Stored little-endian elements decoded to f32 into `out` (as many as
/// `out` holds) on every core, checked for NaN and infinity (`Err(i)`:
/// element `i` is the first not finite). For a reader's 8 MiB pieces:
/// 64 Ki elements a task, so that one piece still spreads over 16 cores.
pub fn decode_f32_parallel(bytes: &[u8], stored: Dtype, out: &mut [f32]) -> Result<(), usize> {
    par_convert_into(bytes, stored, out, 1 << 16)
}

/// The error for element `index` of `tensor` not finite (NaN or
/// infinity), wherever a reader finds one.
pub fn non_finite(tensor: &str, index: usize) -> String {
    format!("tensor '{tensor}' holds NaN or infinity (element {index}); the checkpoint is damaged")
}

/// Stored little-endian elements converted to `target` on every core
/// (rayon), checked for NaN and infinity (`Err(i)`: element `i` is not
/// finite). A device run's layer reader uses it, so that reading the next
/// layer keeps up with the device computing this one; the serial
/// [`Converted`] path holds less at once and serves the CPU backend
/// (`examples/reader_rate.rs` times it).
pub fn convert_parallel(
    bytes: &[u8],
    stored: Dtype,
    target: ComputeDtype,
    shape: Vec<usize>,
) -> Result<TensorData, usize> {
    Ok(match target {
        ComputeDtype::F32 => TensorData::new(par_convert::<f32>(bytes, stored)?, shape),
        ComputeDtype::F16 => TensorData::new(par_convert::<f16>(bytes, stored)?, shape),
        ComputeDtype::Bf16 => TensorData::new(par_convert::<bf16>(bytes, stored)?, shape),
    })
}

/// Input rows and columns a tile of [`convert_transposed`] holds (16 KiB
/// of f32 on the stack).
const TILE: usize = 64;

/// `bytes` of a stored row-major `[rows, cols]` matrix as `T`,
/// `[cols, rows]`, into an output zeroed by the allocator: each task takes
/// a band of `TILE` output rows (input columns) and walks the input down
/// in tiles of `TILE` rows, decoding each tile's rows, then encoding its
/// columns as output row pieces. `Err(i)`: element `i` (row-major, stored
/// order) is the first not finite.
fn par_transpose<T: Target>(
    bytes: &[u8],
    stored: Dtype,
    [rows, cols]: [usize; 2],
) -> Result<Vec<T>, usize> {
    use rayon::prelude::*;
    let width = stored_size(stored).max(1);
    let mut out = bytemuck::allocation::zeroed_vec::<T>(rows * cols);
    if rows == 0 || cols == 0 {
        return Ok(out);
    }
    let bad = out
        .par_chunks_mut(TILE * rows)
        .enumerate()
        .filter_map(|(band, dst)| {
            let (c0, w) = (band * TILE, dst.len() / rows);
            let mut tile = [0f32; TILE * TILE];
            let mut column = [0f32; TILE];
            for r0 in (0..rows).step_by(TILE) {
                let h = TILE.min(rows - r0);
                for dr in 0..h {
                    let at = ((r0 + dr) * cols + c0) * width;
                    let row = &mut tile[dr * TILE..dr * TILE + w];
                    decode_into(&bytes[at..at + w * width], stored, row);
                    // Rows in order: the band's first is its smallest.
                    if let Some(c) = row.iter().position(|v| !v.is_finite()) {
                        return Some((r0 + dr) * cols + c0 + c);
                    }
                }
                for dc in 0..w {
                    for (dr, v) in column[..h].iter_mut().enumerate() {
                        *v = tile[dr * TILE + dc];
                    }
                    let start = dc * rows + r0;
                    T::encode(&column[..h], &mut dst[start..start + h]);
                }
            }
            None
        })
        .min();
    match bad {
        Some(i) => Err(i),
        None => Ok(out),
    }
}

/// A stored row-major `[rows, cols]` matrix (PyTorch's `[out, in]`
/// linear weight) converted to `target` and transposed to `[cols, rows]`
/// (Burn's `[in, out]`) in one pass on every core, checked for NaN and
/// infinity as [`convert_parallel`] checks. Converting and then
/// transposing took a 1B layer's reader 0.45 s on this project's 2-core
/// machine, the transposition two thirds of it (`examples/reader_rate.rs`).
pub fn convert_transposed(
    bytes: &[u8],
    stored: Dtype,
    target: ComputeDtype,
    [rows, cols]: [usize; 2],
) -> Result<TensorData, usize> {
    let (shape, t) = ([rows, cols], [cols, rows]);
    Ok(match target {
        ComputeDtype::F32 => TensorData::new(par_transpose::<f32>(bytes, stored, shape)?, t),
        ComputeDtype::F16 => TensorData::new(par_transpose::<f16>(bytes, stored, shape)?, t),
        ComputeDtype::Bf16 => TensorData::new(par_transpose::<bf16>(bytes, stored, shape)?, t),
    })
}

/// Tensor values being built in the compute dtype, piece by piece, so a
/// tensor read from a mapping is held once: typed and aligned from the
/// start (a byte vector handed to Burn is copied into aligned storage,
/// which held every loaded tensor twice for a moment).
pub enum Converted {
    F32(Vec<f32>),
    F16(Vec<f16>),
    Bf16(Vec<bf16>),
}

impl Converted {
    /// Room for `n` elements of `target`.
    pub fn with_capacity(target: ComputeDtype, n: usize) -> Self {
        match target {
            ComputeDtype::F32 => Converted::F32(Vec::with_capacity(n)),
            ComputeDtype::F16 => Converted::F16(Vec::with_capacity(n)),
            ComputeDtype::Bf16 => Converted::Bf16(Vec::with_capacity(n)),
        }
    }

    /// Appends `bytes`, little-endian elements stored as `stored`.
    pub fn extend(&mut self, bytes: &[u8], stored: Dtype) {
        let two = |c: &[u8]| [c[0], c[1]];
        match (self, stored) {
            (Converted::F16(v), Dtype::F16) => {
                v.extend(bytes.chunks_exact(2).map(|c| f16::from_le_bytes(two(c))))
            }
            (Converted::Bf16(v), Dtype::BF16) => {
                v.extend(bytes.chunks_exact(2).map(|c| bf16::from_le_bytes(two(c))))
            }
            (Converted::F32(v), Dtype::F32) => v.extend(
                bytes
                    .chunks_exact(4)
                    .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])),
            ),
            (Converted::F32(v), d) => v.extend(decode_f32(bytes, d)),
            (Converted::F16(v), d) => v.extend(decode_f32(bytes, d).into_iter().map(f16::from_f32)),
            (Converted::Bf16(v), d) => {
                v.extend(decode_f32(bytes, d).into_iter().map(bf16::from_f32))
            }
        }
    }

    pub fn into_data(self, shape: Vec<usize>) -> TensorData {
        match self {
            Converted::F32(v) => TensorData::new(v, shape),
            Converted::F16(v) => TensorData::new(v, shape),
            Converted::Bf16(v) => TensorData::new(v, shape),
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn non_finite_values_are_found_in_every_stored_dtype() {
        for d in [Dtype::F32, Dtype::F16, Dtype::BF16] {
            for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
                let bytes = encode_f32(&[1.0, -2.5, 0.0, bad, 3.0], d);
                assert_eq!(first_non_finite(&bytes, d), Some(3), "{d:?} {bad}");
            }
            let fine = encode_f32(&[1.0, -65504.0, 0.0, 1e-8], d);
            assert_eq!(first_non_finite(&fine, d), None, "{d:?}");
        }
    }

    use super::*;

    #[test]
    fn round_trips() {
        let v = [1.0f32, -2.5, 0.1, 65504.0];
        for d in [Dtype::F32, Dtype::F16, Dtype::BF16] {
            let back = decode_f32(&encode_f32(&v, d), d);
            for (a, b) in v.iter().zip(&back) {
                assert!((a - b).abs() <= a.abs() * 1e-2, "{d:?}: {a} vs {b}");
            }
        }
        assert_eq!(decode_f32(&encode_f32(&v, Dtype::F32), Dtype::F32), v);
        let mut c = Converted::with_capacity(ComputeDtype::F32, 4);
        c.extend(&encode_f32(&v, Dtype::BF16), Dtype::BF16);
        let data = c.into_data(vec![4]);
        assert_eq!(data.dtype, DType::F32);
        let mut same = Converted::with_capacity(ComputeDtype::Bf16, 4);
        same.extend(&encode_f32(&v, Dtype::BF16), Dtype::BF16);
        assert_eq!(same.into_data(vec![4]).dtype, DType::BF16);
        assert_eq!("bfloat16".parse::<ComputeDtype>(), Ok(ComputeDtype::Bf16));
        assert!("int8".parse::<ComputeDtype>().is_err());
    }

    #[test]
    fn the_parallel_conversion_gives_the_serial_ones_bits() {
        // Two pieces and a partial strip; normals, subnormals, zeros of
        // both signs, values at f16's largest and (stored wider) past it.
        let n = PIECE + STRIP + 17;
        for stored in [Dtype::F32, Dtype::F16, Dtype::BF16] {
            let large = if stored == Dtype::F16 { 65504.0 } else { 7e4 };
            let v: Vec<f32> = (0..n)
                .map(|i| match i % 7 {
                    0 => 0.0,
                    1 => -0.0,
                    2 => 1e-7 * (i % 13) as f32,
                    3 => large + (i % 5) as f32,
                    _ => ((i % 1000) as f32 - 500.0) * 1.3e-3,
                })
                .collect();
            let bytes = encode_f32(&v, stored);
            for target in [ComputeDtype::F32, ComputeDtype::F16, ComputeDtype::Bf16] {
                let parallel = convert_parallel(&bytes, stored, target, vec![n]).unwrap();
                let mut serial = Converted::with_capacity(target, n);
                serial.extend(&bytes, stored);
                let serial = serial.into_data(vec![n]);
                assert_eq!(parallel.dtype, serial.dtype, "{stored:?} -> {target:?}");
                assert!(
                    parallel.bytes[..] == serial.bytes[..],
                    "{stored:?} -> {target:?}"
                );
            }
            // The first element not finite, in the second piece.
            let mut bad = v.clone();
            bad[PIECE + 5] = f32::NAN;
            bad[PIECE + 9] = f32::INFINITY;
            let bytes = encode_f32(&bad, stored);
            let err = convert_parallel(&bytes, stored, ComputeDtype::F16, vec![n]);
            assert_eq!(err.err(), Some(PIECE + 5), "{stored:?}");
        }
    }

    #[test]
    fn converting_transposed_is_converting_then_transposing() {
        // Tiles whole and partial in both directions, one row, one column.
        for [rows, cols] in [[1, 1], [3, 70], [130, 65], [64, 64], [1, 200], [200, 1]] {
            let n = rows * cols;
            let v: Vec<f32> = (0..n).map(|i| (i as f32 - 37.0) * 0.37).collect();
            for stored in [Dtype::F32, Dtype::F16, Dtype::BF16] {
                let bytes = encode_f32(&v, stored);
                for target in [ComputeDtype::F32, ComputeDtype::F16, ComputeDtype::Bf16] {
                    let t = convert_transposed(&bytes, stored, target, [rows, cols]).unwrap();
                    let plain = convert_parallel(&bytes, stored, target, vec![n]).unwrap();
                    assert_eq!(t.shape.to_vec(), vec![cols, rows]);
                    let size = target.size() as usize;
                    for r in 0..rows {
                        for c in 0..cols {
                            let (a, b) = ((c * rows + r) * size, (r * cols + c) * size);
                            assert!(
                                t.bytes[a..a + size] == plain.bytes[b..b + size],
                                "{stored:?} -> {target:?} [{rows}, {cols}] at ({r}, {c})"
                            );
                        }
                    }
                }
                // The first bad element in stored order, wherever its tile.
                if n > 2 {
                    let mut bad = v.clone();
                    bad[n - 1] = f32::NAN;
                    bad[n / 2] = f32::INFINITY;
                    let bytes = encode_f32(&bad, stored);
                    let err = convert_transposed(&bytes, stored, ComputeDtype::F16, [rows, cols]);
                    assert_eq!(err.err(), Some(n / 2), "{stored:?} [{rows}, {cols}]");
                }
            }
        }
    }
}
