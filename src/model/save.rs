//! Writing models: safetensors files from owned tensors, and (for pruned
//! models) a copy of a checkpoint with some tensors replaced, written under a
//! temporary name and renamed into place only when complete.

use std::borrow::Cow;
use std::collections::HashMap;
use std::path::Path;

use safetensors::{Dtype, View};

use super::ModelError;
use super::lock::DestLock;

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

/// A pruned copy of a checkpoint, written while pruning runs.
///
/// Every output shard gets the input shard's header verbatim, so each tensor
/// sits at the same offset with the same name and dtype; pruned tensors are
/// written into place as soon as they exist, the rest copied from the input.
/// Everything goes to `OUT.partial/` and [`PrunedWriter::finish`] renames it
/// to `OUT/`: an interrupted run leaves no half-written model at `OUT`.
/// The writer holds `OUT.lock` ([`DestLock`]) for its lifetime, so a second
/// run saving to `OUT` is refused instead of sharing the partial folder; a
/// writer dropped unfinished (an error, a signal) removes its shard files
/// and leaves only what else is in the partial folder (the run's logs).
pub struct PrunedWriter {
    out: std::path::PathBuf,
    tmp: std::path::PathBuf,
    files: Vec<std::fs::File>,
    /// The shard files, removed unless the folder is renamed into place.
    shards: Vec<crate::scratch::Guard>,
    /// `OUT.partial/` itself, removed after its shards if nothing else (a
    /// log folder) is in it, on a signal too. Declared after `shards`, so it
    /// drops after them.
    _partial: crate::scratch::Guard,
    written: std::collections::HashSet<String>,
    bytes_written: u64,
    /// `--overwrite`: files of the same name in a folder prunemem did not
    /// write may be replaced (`model::owned`).
    overwrite: bool,
    _lock: DestLock,
}

impl PrunedWriter {
    /// Starts a copy of `ckpt` that will end up at `out`.
    /// `out` may exist only if prunemem wrote it, or with `overwrite`; only
    /// prunemem's own files are ever replaced there (`model::owned`).
    pub fn create(
        ckpt: &super::Checkpoint,
        out: &Path,
        overwrite: bool,
    ) -> Result<Self, ModelError> {
        let same = |a: &Path, b: &Path| matches!((a.canonicalize(), b.canonicalize()), (Ok(x), Ok(y)) if x == y);
        if same(out, &ckpt.dir) {
            return Err(ModelError::Checkpoint(format!(
                "{} is the input model's folder; save the pruned model elsewhere",
                out.display()
            )));
        }
        super::owned::check_destination(out, overwrite)?;
        let lock = DestLock::acquire(out)?;
        // Ours alone now: a partial folder left by a killed run goes.
        let tmp = super::convert::tmp_sibling(out);
        if tmp.exists() {
            std::fs::remove_dir_all(&tmp).map_err(|e| ModelError::io(&tmp, e))?;
        }
        std::fs::create_dir_all(&tmp).map_err(|e| ModelError::io(&tmp, e))?;
        let mut files = Vec::new();
        let mut shards = Vec::new();
        for shard in &ckpt.shards {
            let name = shard.path.file_name().unwrap_or_default();
            let path = tmp.join(name);
            let f = std::fs::File::create(&path).map_err(|e| ModelError::io(&path, e))?;
            shards.push(crate::scratch::Guard::new(path.clone()));
            let header = &shard.mmap[..8 + shard.header_len];
            std::os::unix::fs::FileExt::write_all_at(&f, header, 0)
                .map_err(|e| ModelError::io(&path, e))?;
            f.set_len(shard.mmap.len() as u64)
                .map_err(|e| ModelError::io(&path, e))?;
            files.push(f);
        }
        Ok(Self {
            out: out.to_path_buf(),
            tmp: tmp.clone(),
            files,
            shards,
            _partial: crate::scratch::Guard::if_empty(tmp.clone()),
            written: Default::default(),
            bytes_written: 0,
            overwrite,
            _lock: lock,
        })
    }

    /// Writes new values (PyTorch orientation) for tensor `name`, in its
    /// stored dtype.
    pub fn write_f32(
        &mut self,
        ckpt: &super::Checkpoint,
        name: &str,
        values: &[f32],
    ) -> Result<(), ModelError> {
        // Encoded and written 2 Mi values at a time: a large tensor is never
        // held twice (f32 and encoded) in full.
        const CHUNK: usize = 2 << 20;
        let e = ckpt.entry(name)?;
        let width = (e.dtype.bitsize() / 8).max(1);
        if values.len() * width != e.end - e.start {
            return Err(ModelError::Checkpoint(format!(
                "{name}: writing {} values into a {}-byte slot",
                values.len(),
                e.end - e.start
            )));
        }
        let (start, shard, dtype) = (e.start, e.shard, e.dtype);
        for (k, chunk) in values.chunks(CHUNK).enumerate() {
            let bytes = super::dtype::encode_f32(chunk, dtype);
            let at = (start + k * CHUNK * width) as u64;
            std::os::unix::fs::FileExt::write_all_at(&self.files[shard], &bytes, at)
                .map_err(|err| ModelError::io(&self.tmp, err))?;
            self.bytes_written += bytes.len() as u64;
        }
        self.written.insert(name.to_string());
        Ok(())
    }

    /// Copies every not-yet-written tensor whose name starts with `prefix`.
    pub fn copy_rest(&mut self, ckpt: &super::Checkpoint, prefix: &str) -> Result<(), ModelError> {
        let names: Vec<String> = ckpt
            .tensors
            .keys()
            .filter(|n| n.starts_with(prefix) && !self.written.contains(*n))
            .cloned()
            .collect();
        // Written straight from the mapping 8 MiB at a time, each piece's
        // pages released once written: nothing of a tensor is held on the
        // heap (the whole tensor was, until 2026-11-26: SmolLM2's 108 MiB
        // embedding at GradProbe's write step).
        for name in names {
            let e = ckpt.entry(&name)?;
            let mmap = &ckpt.shards[e.shard].mmap;
            let f = &self.files[e.shard];
            super::shard::for_each_chunk_releasing(
                mmap,
                e.start,
                e.end,
                super::shard::READ_CHUNK,
                |at, piece| std::os::unix::fs::FileExt::write_all_at(f, piece, at as u64),
            )
            .map_err(|err| ModelError::io(&self.tmp, err))?;
            self.written.insert(name);
            self.bytes_written += (e.end - e.start) as u64;
        }
        Ok(())
    }

    /// Bytes of tensor data written so far.
    pub fn bytes_written(&self) -> u64 {
        self.bytes_written
    }

    /// Copies what is left and the config and tokenizer files, and syncs:
    /// the temporary folder is then a complete checkpoint (which post-pruning
    /// evaluation streams from). Returns its path.
    pub fn complete(&mut self, ckpt: &super::Checkpoint) -> Result<std::path::PathBuf, ModelError> {
        self.copy_rest(ckpt, "")?;
        for f in &self.files {
            f.sync_all().map_err(|e| ModelError::io(&self.tmp, e))?;
        }
        let entries = std::fs::read_dir(&ckpt.dir).map_err(|e| ModelError::io(&ckpt.dir, e))?;
        for entry in entries.flatten() {
            let name = entry.file_name();
            let n = name.to_string_lossy();
            let wanted = n.ends_with(".json") || n.ends_with(".txt") || n == "tokenizer.model";
            if wanted && !self.tmp.join(&name).exists() {
                std::fs::copy(entry.path(), self.tmp.join(&name))
                    .map_err(|e| ModelError::io(&entry.path(), e))?;
            }
        }
        Ok(self.tmp.clone())
    }

    /// The temporary folder being written.
    pub fn partial_dir(&self) -> &Path {
        &self.tmp
    }

    /// [`PrunedWriter::complete`], then the dense shards are replaced by
    /// the compressed-tensors layout `format` inside the partial folder,
    /// which is then renamed into place: a run stopped at any point leaves
    /// no model at `out`, never a half-compressed one.
    pub fn finish_compressed(
        mut self,
        ckpt: &super::Checkpoint,
        format: super::compressed::SparseFormat,
    ) -> Result<(std::path::PathBuf, super::compressed::CompressReport), ModelError> {
        let dense_dir = self.complete(ckpt)?;
        let staging = dense_dir.join("compressed.partial");
        std::fs::create_dir_all(&staging).map_err(|e| ModelError::io(&staging, e))?;
        let mut report = {
            let dense = super::Checkpoint::open(&dense_dir)?;
            super::compressed::compress(&dense, &staging, format)?
        };
        for g in std::mem::take(&mut self.shards) {
            let path = g.path().to_path_buf();
            std::fs::remove_file(&path).map_err(|e| ModelError::io(&path, e))?;
            g.keep();
        }
        self.files.clear();
        let index = dense_dir.join(super::checkpoint::INDEX_FILE);
        if index.exists() {
            std::fs::remove_file(&index).map_err(|e| ModelError::io(&index, e))?;
        }
        for name in [super::checkpoint::SINGLE_FILE, "config.json"] {
            let (from, to) = (staging.join(name), dense_dir.join(name));
            std::fs::rename(&from, &to).map_err(|e| ModelError::io(&from, e))?;
            // The compressed file is the folder's now: removed with it.
            if name == super::checkpoint::SINGLE_FILE {
                self.shards.push(crate::scratch::Guard::new(to));
            }
        }
        std::fs::remove_dir(&staging).map_err(|e| ModelError::io(&staging, e))?;
        report.out = self.out.clone();
        Ok((self.finish(ckpt)?, report))
    }

    /// [`PrunedWriter::complete`], then renames the folder into place
    /// (an older `out` prunemem wrote is replaced entry by entry; nothing it
    /// did not write is removed: `model::owned`).
    pub fn finish(mut self, ckpt: &super::Checkpoint) -> Result<std::path::PathBuf, ModelError> {
        if !self.files.is_empty() {
            self.complete(ckpt)?;
        }
        super::owned::install(&self.tmp, &self.out, self.overwrite)?;
        for g in std::mem::take(&mut self.shards) {
            g.keep();
        }
        Ok(self.out.clone())
    }
}
