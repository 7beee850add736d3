//! `prunemem convert`: import a llama.cpp GGUF as a Hugging Face folder
//! (`--gguf FILE`), or rewrite a safetensors folder as dense or as
//! compressed-tensors sparse weights (`--model DIR --to ...`).

use std::path::PathBuf;
use std::time::Instant;

use clap::Args;

use super::CliResult;
use crate::model::compressed::{self, SparseFormat};
use crate::model::convert::convert_gguf;
use crate::units::{format_bytes, format_count};

#[derive(Args, Debug)]
pub struct ConvertArgs {
    /// The GGUF file to import (F32, F16, BF16, Q8_0, Q4_0 and Q4_1 tensors)
    #[arg(
        long,
        value_name = "FILE",
        conflicts_with = "model",
        required_unless_present = "model"
    )]
    gguf: Option<PathBuf>,
    /// A model folder to rewrite (dense, or compressed-tensors sparse)
    #[arg(long, value_name = "DIR")]
    model: Option<PathBuf>,
    /// Output folder: created, or replaced if prunemem wrote it
    #[arg(long, value_name = "DIR")]
    out: PathBuf,
    /// Let --out be an existing folder prunemem did not write (only files of the same name are replaced; nothing else is deleted)
    #[arg(long)]
    overwrite: bool,
    /// GGUF import: stored dtype of the written weights
    #[arg(long, default_value = "f32", value_parser = ["f32", "f16", "bf16"])]
    dtype: String,
    /// --model: dense, compressed (2:4 format when every decoder weight is 2:4, else bitmask), sparse-bitmask or sparse-24-bitmask
    #[arg(long, default_value = "dense", value_parser = ["dense", "compressed", "sparse-bitmask", "sparse-24-bitmask"])]
    to: String,
}

pub fn run(args: ConvertArgs) -> CliResult<i32> {
    match (&args.gguf, &args.model) {
        (Some(gguf), _) => import_gguf(gguf, &args),
        (None, Some(model)) => rewrite(model, &args),
        (None, None) => unreachable!("clap requires --gguf or --model"),
    }
}

fn import_gguf(gguf: &std::path::Path, args: &ConvertArgs) -> CliResult<i32> {
    let dtype = match args.dtype.as_str() {
        "f16" => safetensors::Dtype::F16,
        "bf16" => safetensors::Dtype::BF16,
        _ => safetensors::Dtype::F32,
    };
    let t = Instant::now();
    let report = convert_gguf(gguf, &args.out, dtype, args.overwrite)?;
    let size = std::fs::metadata(report.out.join("model.safetensors"))
        .map(|m| m.len())
        .unwrap_or(0);
    let types: Vec<String> = report
        .source_types
        .iter()
        .map(|(t, n)| format!("{n}×{t}"))
        .collect();
    println!(
        "converted {} ({} architecture, {} tensors: {}) → {} ({} parameters, {} as {}) in {:.1}s",
        gguf.display(),
        report.architecture,
        report.tensors,
        types.join(", "),
        report.out.display(),
        format_count(report.params),
        format_bytes(size),
        args.dtype,
        t.elapsed().as_secs_f64()
    );
    Ok(0)
}

fn rewrite(model: &std::path::Path, args: &ConvertArgs) -> CliResult<i32> {
    let t = Instant::now();
    let format = match args.to.as_str() {
        "sparse-bitmask" => Some(SparseFormat::Bitmask),
        "sparse-24-bitmask" => Some(SparseFormat::TwoFour),
        "compressed" => None,
        _ => {
            let r = compressed::rewrite_dense(model, &args.out, args.overwrite)?;
            println!(
                "decompressed {} ({}, {} of weights) → {} (dense, {}) in {:.1}s",
                model.display(),
                r.format.name(),
                format_bytes(r.bytes_in),
                r.out.display(),
                format_bytes(r.bytes_out),
                t.elapsed().as_secs_f64()
            );
            return Ok(0);
        }
    };
    let ckpt = crate::model::Checkpoint::open(model)?;
    let r = compressed::rewrite_compressed(&ckpt, model, &args.out, format, args.overwrite)?;
    println!(
        "compressed {} ({} of weights, {:.2}% of the decoder linears zero) → {} ({}, {}) in {:.1}s",
        model.display(),
        format_bytes(r.bytes_in),
        100.0 * r.global_sparsity,
        r.out.display(),
        r.format.name(),
        format_bytes(r.bytes_out),
        t.elapsed().as_secs_f64()
    );
    Ok(0)
}
