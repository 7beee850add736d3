//! llama.cpp's GGUF container: metadata, tensor directory, and dequantisation
//! of the block formats prunemem imports (F32, F16, BF16, Q8_0, Q4_0, Q4_1).
//!
//! The file is memory-mapped; tensors are dequantised one at a time, so
//! converting a model never holds more than one dequantised tensor.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use half::{bf16, f16};
use memmap2::Mmap;

use super::ModelError;

/// A metadata value.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    U64(u64),
    I64(i64),
    F32(f32),
    F64(f64),
    Bool(bool),
    Str(String),
    Array(Vec<Value>),
}

impl Value {
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            Value::U8(v) => Some(v as u64),
            Value::U16(v) => Some(v as u64),
            Value::U32(v) => Some(v as u64),
            Value::U64(v) => Some(v),
            Value::I8(v) if v >= 0 => Some(v as u64),
            Value::I16(v) if v >= 0 => Some(v as u64),
            Value::I32(v) if v >= 0 => Some(v as u64),
            Value::I64(v) if v >= 0 => Some(v as u64),
            _ => None,
        }
    }
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            Value::F32(v) => Some(v as f64),
            Value::F64(v) => Some(v),
            _ => self.as_u64().map(|v| v as f64),
        }
    }
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::Str(s) => Some(s),
            _ => None,
        }
    }
    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            Value::Bool(b) => Some(b),
            _ => None,
        }
    }
    pub fn as_array(&self) -> Option<&[Value]> {
        match self {
            Value::Array(a) => Some(a),
            _ => None,
        }
    }
}

/// GGML tensor types prunemem can dequantise.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GgmlType {
    F32,
    F16,
    Bf16,
    Q4_0,
    Q4_1,
    Q8_0,
}

impl GgmlType {
    /// The type with GGML id `id`, or the name of an unsupported one.
    pub fn from_id(id: u32) -> Result<Self, String> {
        Ok(match id {
            0 => GgmlType::F32,
            1 => GgmlType::F16,
            2 => GgmlType::Q4_0,
            3 => GgmlType::Q4_1,
            8 => GgmlType::Q8_0,
            30 => GgmlType::Bf16,
            other => return Err(ggml_type_name(other)),
        })
    }

    /// (elements per block, bytes per block).
    fn block(self) -> (usize, usize) {
        match self {
            GgmlType::F32 => (1, 4),
            GgmlType::F16 | GgmlType::Bf16 => (1, 2),
            GgmlType::Q4_0 => (32, 18),
            GgmlType::Q4_1 => (32, 20),
            GgmlType::Q8_0 => (32, 34),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            GgmlType::F32 => "F32",
            GgmlType::F16 => "F16",
            GgmlType::Bf16 => "BF16",
            GgmlType::Q4_0 => "Q4_0",
            GgmlType::Q4_1 => "Q4_1",
            GgmlType::Q8_0 => "Q8_0",
        }
    }
}

fn ggml_type_name(id: u32) -> String {
    const NAMES: [&str; 42] = [
        "F32",
        "F16",
        "Q4_0",
        "Q4_1",
        "Q4_2",
        "Q4_3",
        "Q5_0",
        "Q5_1",
        "Q8_0",
        "Q8_1",
        "Q2_K",
        "Q3_K",
        "Q4_K",
        "Q5_K",
        "Q6_K",
        "Q8_K",
        "IQ2_XXS",
        "IQ2_XS",
        "IQ3_XXS",
        "IQ1_S",
        "IQ4_NL",
        "IQ3_S",
        "IQ2_S",
        "IQ4_XS",
        "I8",
        "I16",
        "I32",
        "I64",
        "F64",
        "IQ1_M",
        "BF16",
        "Q4_0_4_4",
        "Q4_0_4_8",
        "Q4_0_8_8",
        "TQ1_0",
        "TQ2_0",
        "IQ4_NL_4_4",
        "IQ4_NL_4_8",
        "IQ4_NL_8_8",
        "MXFP4",
        "NVFP4",
        "UNKNOWN",
    ];
    NAMES
        .get(id as usize)
        .map(|n| n.to_string())
        .unwrap_or_else(|| format!("type id {id}"))
}

/// One tensor in the directory.
#[derive(Debug, Clone)]
pub struct GgufTensor {
    pub name: String,
    /// GGML order: `dims[0]` varies fastest. PyTorch shape is the reverse.
    pub dims: Vec<u64>,
    /// The raw type id (kept so an unsupported type is reported only when
    /// the tensor is needed).
    pub type_id: u32,
    /// Offset from the start of the data section.
    pub offset: u64,
}

impl GgufTensor {
    /// Element count (dimensions are checked when the file is opened, so
    /// this cannot overflow for a tensor of an opened file).
    pub fn elements(&self) -> u64 {
        self.dims.iter().fold(1u64, |a, d| a.saturating_mul(*d))
    }
    /// Shape in PyTorch order (outermost first).
    pub fn torch_shape(&self) -> Vec<usize> {
        self.dims.iter().rev().map(|d| *d as usize).collect()
    }
}

/// An opened GGUF file.
pub struct GgufFile {
    pub path: PathBuf,
    mmap: Mmap,
    pub version: u32,
    pub metadata: BTreeMap<String, Value>,
    pub tensors: Vec<GgufTensor>,
    data_start: usize,
}

struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], String> {
        let end = self.pos.checked_add(n).filter(|e| *e <= self.buf.len());
        let Some(end) = end else {
            return Err(format!(
                "file ends inside the header (needs {n} bytes at offset {})",
                self.pos
            ));
        };
        let s = &self.buf[self.pos..end];
        self.pos = end;
        Ok(s)
    }
    fn u8(&mut self) -> Result<u8, String> {
        Ok(self.take(1)?[0])
    }
    fn u16(&mut self) -> Result<u16, String> {
        Ok(u16::from_le_bytes(
            self.take(2)?.try_into().unwrap_or_default(),
        ))
    }
    fn u32(&mut self) -> Result<u32, String> {
        Ok(u32::from_le_bytes(
            self.take(4)?.try_into().unwrap_or_default(),
        ))
    }
    fn u64(&mut self) -> Result<u64, String> {
        Ok(u64::from_le_bytes(
            self.take(8)?.try_into().unwrap_or_default(),
        ))
    }
    fn len(&mut self, what: &str) -> Result<usize, String> {
        let n = self.u64()?;
        if n > self.buf.len() as u64 {
            return Err(format!("{what} length {n} exceeds the file size"));
        }
        Ok(n as usize)
    }
    fn string(&mut self) -> Result<String, String> {
        let n = self.len("string")?;
        let bytes = self.take(n)?;
        String::from_utf8(bytes.to_vec())
            .map_err(|_| format!("non-UTF-8 string at offset {}", self.pos - n))
    }
    fn value(&mut self, ty: u32, depth: usize) -> Result<Value, String> {
        Ok(match ty {
            0 => Value::U8(self.u8()?),
            1 => Value::I8(self.u8()? as i8),
            2 => Value::U16(self.u16()?),
            3 => Value::I16(self.u16()? as i16),
            4 => Value::U32(self.u32()?),
            5 => Value::I32(self.u32()? as i32),
            6 => Value::F32(f32::from_bits(self.u32()?)),
            7 => Value::Bool(self.u8()? != 0),
            8 => Value::Str(self.string()?),
            9 => {
                if depth > 2 {
                    return Err("metadata arrays nested too deeply".into());
                }
                let inner = self.u32()?;
                let n = self.len("array")?;
                let mut items = Vec::with_capacity(n.min(1 << 20));
                for _ in 0..n {
                    items.push(self.value(inner, depth + 1)?);
                }
                Value::Array(items)
            }
            10 => Value::U64(self.u64()?),
            11 => Value::I64(self.u64()? as i64),
            12 => Value::F64(f64::from_bits(self.u64()?)),
            other => return Err(format!("unknown metadata value type {other}")),
        })
    }
}

impl GgufFile {
    /// Maps and parses `path`'s header and tensor directory.
    pub fn open(path: &Path) -> Result<Self, ModelError> {
        let file = crate::input::open(path, u64::MAX, "a GGUF file")?;
        // SAFETY: read-only mapping of an input file prunemem never writes.
        let mmap = unsafe { Mmap::map(&file) }.map_err(|e| ModelError::io(path, e))?;
        let err = |reason: String| ModelError::Gguf {
            path: path.display().to_string(),
            reason,
        };
        let mut c = Cursor { buf: &mmap, pos: 0 };
        if c.take(4).map_err(&err)? != b"GGUF" {
            return Err(err("not a GGUF file (bad magic)".into()));
        }
        let version = c.u32().map_err(&err)?;
        if !(2..=3).contains(&version) {
            return Err(err(format!(
                "unsupported GGUF version {version} (supported: 2, 3)"
            )));
        }
        let n_tensors = c.len("tensor count").map_err(&err)?;
        let n_kv = c.len("metadata count").map_err(&err)?;
        let mut metadata = BTreeMap::new();
        for _ in 0..n_kv {
            let key = c.string().map_err(&err)?;
            let ty = c.u32().map_err(&err)?;
            let value = c
                .value(ty, 0)
                .map_err(|e| err(format!("metadata '{key}': {e}")))?;
            metadata.insert(key, value);
        }
        // The count is bounded by the file size, not by memory: grow as read.
        let mut tensors = Vec::with_capacity(n_tensors.min(4096));
        for _ in 0..n_tensors {
            let name = c.string().map_err(&err)?;
            let n_dims = c.u32().map_err(&err)? as usize;
            if n_dims == 0 || n_dims > 4 {
                return Err(err(format!("tensor '{name}' has {n_dims} dimensions")));
            }
            let dims = (0..n_dims)
                .map(|_| c.u64())
                .collect::<Result<Vec<_>, _>>()
                .map_err(&err)?;
            let elements = dims.iter().try_fold(1u64, |a, d| a.checked_mul(*d));
            if dims.contains(&0) || elements.is_none_or(|n| n > mmap.len() as u64 * 2) {
                return Err(err(format!(
                    "tensor '{name}' has impossible dimensions {dims:?} for a file of {} bytes",
                    mmap.len()
                )));
            }
            let type_id = c.u32().map_err(&err)?;
            let offset = c.u64().map_err(&err)?;
            tensors.push(GgufTensor {
                name,
                dims,
                type_id,
                offset,
            });
        }
        let alignment = metadata
            .get("general.alignment")
            .and_then(Value::as_u64)
            .unwrap_or(32);
        if !alignment.is_power_of_two() || alignment > 1 << 20 {
            return Err(err(format!(
                "general.alignment {alignment} is not a power of two up to 1 MiB"
            )));
        }
        let alignment = alignment as usize;
        let data_start = c.pos.div_ceil(alignment) * alignment;
        let gguf = Self {
            path: path.to_path_buf(),
            mmap,
            version,
            metadata,
            tensors,
            data_start,
        };
        for t in &gguf.tensors {
            if let Ok(ty) = GgmlType::from_id(t.type_id) {
                gguf.tensor_bytes(t, ty)?;
            }
        }
        Ok(gguf)
    }

    pub fn get(&self, key: &str) -> Option<&Value> {
        self.metadata.get(key)
    }

    pub fn tensor(&self, name: &str) -> Option<&GgufTensor> {
        self.tensors.iter().find(|t| t.name == name)
    }

    fn tensor_bytes(&self, t: &GgufTensor, ty: GgmlType) -> Result<&[u8], ModelError> {
        let (per_block, block_bytes) = ty.block();
        let n = t.elements() as usize;
        let bad = |reason: String| ModelError::Gguf {
            path: self.path.display().to_string(),
            reason,
        };
        if !n.is_multiple_of(per_block) {
            return Err(bad(format!(
                "tensor '{}' has {n} elements, not a multiple of {per_block}",
                t.name
            )));
        }
        let len = (n / per_block).checked_mul(block_bytes);
        let start = usize::try_from(t.offset)
            .ok()
            .and_then(|o| self.data_start.checked_add(o));
        match start.zip(len).and_then(|(s, l)| Some(s..s.checked_add(l)?)) {
            Some(r) if r.end <= self.mmap.len() => Ok(&self.mmap[r]),
            _ => Err(bad(format!(
                "tensor '{}' extends past the end of the file (truncated?)",
                t.name
            ))),
        }
    }

    /// Dequantises a tensor to f32 (in GGML order, which is PyTorch's
    /// row-major order for the reversed shape).
    pub fn dequantize(&self, t: &GgufTensor) -> Result<Vec<f32>, ModelError> {
        let ty = GgmlType::from_id(t.type_id).map_err(|ty| ModelError::Gguf {
            path: self.path.display().to_string(),
            reason: format!(
                "tensor '{}' uses quantisation type {ty}, which prunemem cannot import (supported: F32, F16, BF16, Q8_0, Q4_0, Q4_1)",
                t.name
            ),
        })?;
        Ok(dequantize(self.tensor_bytes(t, ty)?, ty))
    }
}

/// Dequantises raw GGML blocks of type `ty`.
pub fn dequantize(bytes: &[u8], ty: GgmlType) -> Vec<f32> {
    let f16_at = |b: &[u8], i: usize| f16::from_le_bytes([b[i], b[i + 1]]).to_f32();
    match ty {
        GgmlType::F32 => bytes
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect(),
        GgmlType::F16 => bytes.chunks_exact(2).map(|c| f16_at(c, 0)).collect(),
        GgmlType::Bf16 => bytes
            .chunks_exact(2)
            .map(|c| bf16::from_le_bytes([c[0], c[1]]).to_f32())
            .collect(),
        GgmlType::Q8_0 => {
            let mut out = Vec::with_capacity(bytes.len() / 34 * 32);
            for b in bytes.chunks_exact(34) {
                let d = f16_at(b, 0);
                out.extend(b[2..34].iter().map(|q| (*q as i8) as f32 * d));
            }
            out
        }
        GgmlType::Q4_0 => {
            let mut out = vec![0f32; bytes.len() / 18 * 32];
            for (b, o) in bytes.chunks_exact(18).zip(out.chunks_exact_mut(32)) {
                let d = f16_at(b, 0);
                for j in 0..16 {
                    let q = b[2 + j];
                    o[j] = ((q & 0x0F) as i32 - 8) as f32 * d;
                    o[j + 16] = ((q >> 4) as i32 - 8) as f32 * d;
                }
            }
            out
        }
        GgmlType::Q4_1 => {
            let mut out = vec![0f32; bytes.len() / 20 * 32];
            for (b, o) in bytes.chunks_exact(20).zip(out.chunks_exact_mut(32)) {
                let d = f16_at(b, 0);
                let m = f16_at(b, 2);
                for j in 0..16 {
                    let q = b[4 + j];
                    o[j] = (q & 0x0F) as f32 * d + m;
                    o[j + 16] = (q >> 4) as f32 * d + m;
                }
            }
            out
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h(v: f32) -> [u8; 2] {
        f16::from_f32(v).to_le_bytes()
    }

    #[test]
    fn q4_0_block() {
        let mut b = Vec::from(h(0.5));
        // low nibble j, high nibble 15-j
        b.extend((0..16u8).map(|j| j | ((15 - j) << 4)));
        let v = dequantize(&b, GgmlType::Q4_0);
        assert_eq!(v.len(), 32);
        assert_eq!(v[0], -4.0); // (0-8)*0.5
        assert_eq!(v[15], 3.5); // (15-8)*0.5
        assert_eq!(v[16], 3.5); // high nibble of byte 0 = 15
        assert_eq!(v[31], -4.0);
    }

    #[test]
    fn q4_1_block() {
        let mut b = Vec::from(h(0.25));
        b.extend(h(-1.0));
        b.extend((0..16u8).map(|j| j | (j << 4)));
        let v = dequantize(&b, GgmlType::Q4_1);
        assert_eq!(v[0], -1.0);
        assert_eq!(v[3], -0.25);
        assert_eq!(v[19], -0.25);
    }

    #[test]
    fn q8_0_block() {
        let mut b = Vec::from(h(2.0));
        b.extend((0..32).map(|j| (j as i8 - 16) as u8));
        let v = dequantize(&b, GgmlType::Q8_0);
        assert_eq!(v[0], -32.0);
        assert_eq!(v[31], 30.0);
    }

    #[test]
    fn unsupported_types_are_named() {
        assert_eq!(GgmlType::from_id(12), Err("Q4_K".to_string()));
        assert_eq!(GgmlType::from_id(14), Err("Q6_K".to_string()));
        assert_eq!(GgmlType::from_id(3), Ok(GgmlType::Q4_1));
    }
}
