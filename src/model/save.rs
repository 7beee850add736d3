//! Writing models: safetensors files from owned tensors, and (for pruned
//! models) a copy of a checkpoint with some tensors replaced, written under a
//! temporary name and renamed into place only when complete.

use std::borrow::Cow;
use std::collections::HashMap;
use std::path::Path;

use safetensors::{Dtype, View};

use super::ModelError;

/// A tensor held in memory, ready to write.
pub struct OwnedTensor {
    pub name: String,
    pub dtype: Dtype,
    pub shape: Vec<usize>,
    pub data: Vec<u8>,
}

impl View for &OwnedTensor {
    fn dtype(&self) -> Dtype {
        self.dtype
    }
    fn shape(&self) -> &[usize] {
        &self.shape
    }
    fn data(&self) -> Cow<'_, [u8]> {
        Cow::Borrowed(&self.data)
    }
    fn data_len(&self) -> usize {
        self.data.len()
    }
}

/// Writes `tensors` as one safetensors file.
pub fn write_safetensors(path: &Path, tensors: Vec<OwnedTensor>) -> Result<(), ModelError> {
    let mut meta = HashMap::new();
    meta.insert("format".to_string(), "pt".to_string());
    let views: Vec<(String, &OwnedTensor)> = tensors.iter().map(|t| (t.name.clone(), t)).collect();
    safetensors::serialize_to_file(views, Some(meta), path)
        .map_err(|e| ModelError::io(path, format!("{e:?}")))
}
