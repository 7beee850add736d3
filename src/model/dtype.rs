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
    match d {
        Dtype::F32 => bytes
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect(),
        Dtype::F16 => bytes
            .chunks_exact(2)
            .map(|c| f16::from_le_bytes([c[0], c[1]]).to_f32())
            .collect(),
        Dtype::BF16 => bytes
            .chunks_exact(2)
            .map(|c| bf16::from_le_bytes([c[0], c[1]]).to_f32())
            .collect(),
        _ => Vec::new(),
    }
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

/// Elements per piece of [`convert_parallel`] (1 Mi).
const PIECE: usize = 1 << 20;

/// One little-endian stored element as f32.
fn decode_one(c: &[u8], d: Dtype) -> f32 {
    match d {
        Dtype::F16 => f16::from_le_bytes([c[0], c[1]]).to_f32(),
        Dtype::BF16 => f32::from_bits((u16::from_le_bytes([c[0], c[1]]) as u32) << 16),
        _ => f32::from_le_bytes([c[0], c[1], c[2], c[3]]),
    }
}

fn par_convert<T: Copy + Default + Send>(
    bytes: &[u8],
    stored: Dtype,
    to: fn(f32) -> T,
) -> Result<Vec<T>, usize> {
    use rayon::prelude::*;
    let width = stored_size(stored).max(1);
    let mut out = vec![T::default(); bytes.len() / width];
    let bad = out
        .par_chunks_mut(PIECE)
        .zip(bytes.par_chunks(PIECE * width))
        .enumerate()
        .filter_map(|(k, (dst, src))| {
            let mut first = None;
            for (i, (d, c)) in dst.iter_mut().zip(src.chunks_exact(width)).enumerate() {
                let v = decode_one(c, stored);
                if !v.is_finite() && first.is_none() {
                    first = Some(k * PIECE + i);
                }
                *d = to(v);
            }
            first
        })
        .min();
    match bad {
        Some(i) => Err(i),
        None => Ok(out),
    }
}

/// Stored little-endian elements converted to `target` on every core
/// (rayon), checked for NaN and infinity (`Err(i)`: element `i` is not
/// finite). A device run's layer reader uses it, so that reading the next
/// layer keeps up with the device computing this one; the serial
/// [`Converted`] path holds less at once and serves the CPU backend.
pub fn convert_parallel(
    bytes: &[u8],
    stored: Dtype,
    target: ComputeDtype,
    shape: Vec<usize>,
) -> Result<TensorData, usize> {
    Ok(match target {
        ComputeDtype::F32 => TensorData::new(par_convert(bytes, stored, |v| v)?, shape),
        ComputeDtype::F16 => TensorData::new(par_convert(bytes, stored, f16::from_f32)?, shape),
        ComputeDtype::Bf16 => TensorData::new(par_convert(bytes, stored, bf16::from_f32)?, shape),
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
}
