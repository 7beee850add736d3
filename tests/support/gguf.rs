//! A minimal GGUF v3 writer for tests: metadata, tensors in F32/F16/Q8_0/
//! Q4_0/Q4_1 (quantised here the way llama.cpp's reference quantisers do),
//! and llama.cpp's q/k row permutation.

#![allow(dead_code)]

use half::f16;

pub enum Meta {
    U32(u32),
    F32(f32),
    Bool(bool),
    Str(String),
    Strs(Vec<String>),
    I32s(Vec<i32>),
}

pub struct GgufTensorIn {
    pub name: String,
    /// PyTorch shape (outermost first).
    pub shape: Vec<usize>,
    /// GGML type id: 0 F32, 1 F16, 2 Q4_0, 3 Q4_1, 8 Q8_0, or anything to test errors.
    pub ty: u32,
    pub values: Vec<f32>,
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    out.extend((s.len() as u64).to_le_bytes());
    out.extend(s.as_bytes());
}

/// llama.cpp's `permute(w, n_head)`: reshape(n_head, 2, rows/n_head/2, cols)
/// then swap the two middle axes.
pub fn permute_rows(w: &[f32], rows: usize, cols: usize, heads: usize) -> Vec<f32> {
    let half = rows / heads / 2;
    let mut out = vec![0f32; w.len()];
    for h in 0..heads {
        for t in 0..2 {
            for d in 0..half {
                let src = h * 2 * half + t * half + d;
                let dst = h * 2 * half + d * 2 + t;
                out[dst * cols..(dst + 1) * cols].copy_from_slice(&w[src * cols..(src + 1) * cols]);
            }
        }
    }
    out
}

fn quantize(values: &[f32], ty: u32) -> Vec<u8> {
    let mut out = Vec::new();
    match ty {
        0 => values.iter().for_each(|v| out.extend(v.to_le_bytes())),
        1 => values
            .iter()
            .for_each(|v| out.extend(f16::from_f32(*v).to_le_bytes())),
        8 => {
            for b in values.chunks(32) {
                let amax = b.iter().fold(0f32, |a, v| a.max(v.abs()));
                let d = amax / 127.0;
                let id = if d != 0.0 { 1.0 / d } else { 0.0 };
                out.extend(f16::from_f32(d).to_le_bytes());
                out.extend(b.iter().map(|v| (v * id).round() as i8 as u8));
            }
        }
        2 => {
            for b in values.chunks(32) {
                let max = b
                    .iter()
                    .fold(0f32, |a, v| if v.abs() > a.abs() { *v } else { a });
                let d = max / -8.0;
                let id = if d != 0.0 { 1.0 / d } else { 0.0 };
                out.extend(f16::from_f32(d).to_le_bytes());
                for j in 0..16 {
                    let q0 = ((b[j] * id + 8.5) as i32).clamp(0, 15) as u8;
                    let q1 = ((b[j + 16] * id + 8.5) as i32).clamp(0, 15) as u8;
                    out.push(q0 | (q1 << 4));
                }
            }
        }
        3 => {
            for b in values.chunks(32) {
                let min = b.iter().fold(f32::MAX, |a, v| a.min(*v));
                let max = b.iter().fold(f32::MIN, |a, v| a.max(*v));
                let d = (max - min) / 15.0;
                let id = if d != 0.0 { 1.0 / d } else { 0.0 };
                out.extend(f16::from_f32(d).to_le_bytes());
                out.extend(f16::from_f32(min).to_le_bytes());
                for j in 0..16 {
                    let q0 = (((b[j] - min) * id + 0.5) as i32).clamp(0, 15) as u8;
                    let q1 = (((b[j + 16] - min) * id + 0.5) as i32).clamp(0, 15) as u8;
                    out.push(q0 | (q1 << 4));
                }
            }
        }
        // Unsupported types: write 16 bytes per 32 elements of filler.
        _ => out.extend(std::iter::repeat_n(0u8, values.len() / 2)),
    }
    out
}

/// Serialises a GGUF v3 file.
pub fn write(meta: &[(&str, Meta)], tensors: &[GgufTensorIn]) -> Vec<u8> {
    let mut out = Vec::new();
    out.extend(b"GGUF");
    out.extend(3u32.to_le_bytes());
    out.extend((tensors.len() as u64).to_le_bytes());
    out.extend((meta.len() as u64).to_le_bytes());
    for (key, value) in meta {
        put_str(&mut out, key);
        match value {
            Meta::U32(v) => {
                out.extend(4u32.to_le_bytes());
                out.extend(v.to_le_bytes());
            }
            Meta::F32(v) => {
                out.extend(6u32.to_le_bytes());
                out.extend(v.to_le_bytes());
            }
            Meta::Bool(v) => {
                out.extend(7u32.to_le_bytes());
                out.push(*v as u8);
            }
            Meta::Str(s) => {
                out.extend(8u32.to_le_bytes());
                put_str(&mut out, s);
            }
            Meta::Strs(v) => {
                out.extend(9u32.to_le_bytes());
                out.extend(8u32.to_le_bytes());
                out.extend((v.len() as u64).to_le_bytes());
                v.iter().for_each(|s| put_str(&mut out, s));
            }
            Meta::I32s(v) => {
                out.extend(9u32.to_le_bytes());
                out.extend(5u32.to_le_bytes());
                out.extend((v.len() as u64).to_le_bytes());
                v.iter().for_each(|x| out.extend(x.to_le_bytes()));
            }
        }
    }
    let blobs: Vec<Vec<u8>> = tensors.iter().map(|t| quantize(&t.values, t.ty)).collect();
    let mut offset = 0u64;
    for (t, blob) in tensors.iter().zip(&blobs) {
        put_str(&mut out, &t.name);
        out.extend((t.shape.len() as u32).to_le_bytes());
        for d in t.shape.iter().rev() {
            out.extend((*d as u64).to_le_bytes());
        }
        out.extend(t.ty.to_le_bytes());
        out.extend(offset.to_le_bytes());
        offset += (blob.len() as u64).div_ceil(32) * 32;
    }
    while out.len() % 32 != 0 {
        out.push(0);
    }
    for blob in &blobs {
        out.extend(blob);
        while out.len() % 32 != 0 {
            out.push(0);
        }
    }
    out
}

/// Dequantises like llama.cpp, to compare converted weights with.
pub fn roundtrip(values: &[f32], ty: u32) -> Vec<f32> {
    let ggml = match ty {
        0 => prunemem::model::gguf::GgmlType::F32,
        1 => prunemem::model::gguf::GgmlType::F16,
        2 => prunemem::model::gguf::GgmlType::Q4_0,
        3 => prunemem::model::gguf::GgmlType::Q4_1,
        _ => prunemem::model::gguf::GgmlType::Q8_0,
    };
    prunemem::model::gguf::dequantize(&quantize(values, ty), ggml)
}
