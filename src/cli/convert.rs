//! `prunemem convert --gguf FILE --out DIR`: import a llama.cpp GGUF as a
//! Hugging Face folder prunemem (and transformers) can load.

use std::path::PathBuf;
use std::time::Instant;

use clap::Args;

use super::CliResult;
use crate::model::convert::convert_gguf;
use crate::units::{format_bytes, format_count};

#[derive(Args, Debug)]
pub struct ConvertArgs {
    /// The GGUF file to import (F32, F16, BF16, Q8_0, Q4_0 and Q4_1 tensors)
    #[arg(long, value_name = "FILE")]
    gguf: PathBuf,
    /// Output folder (replaced if it exists)
    #[arg(long, value_name = "DIR")]
    out: PathBuf,
    /// Stored dtype of the written weights
    #[arg(long, default_value = "f32", value_parser = ["f32", "f16", "bf16"])]
    dtype: String,
}

pub fn run(args: ConvertArgs) -> CliResult<i32> {
    let dtype = match args.dtype.as_str() {
        "f16" => safetensors::Dtype::F16,
        "bf16" => safetensors::Dtype::BF16,
        _ => safetensors::Dtype::F32,
    };
    let t = Instant::now();
    let report = convert_gguf(&args.gguf, &args.out, dtype)?;
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
        args.gguf.display(),
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
