//! How fast a device run's host side prepares a checkpoint for the device:
//! one decoder layer read, converted and laid out in Burn's layout
//! (`model::prefetch::read_layer`, what the reader thread does for the
//! next layer while the device computes this one), and the vocabulary
//! table converted (`Checkpoint::read_converted`, what the evaluation's
//! head waits for), and the calibration's embedding (32 windows of 512
//! tokens, their rows read and converted, `model::vocab::read_rows`, and
//! the table's finiteness check, `vocab::check_finite`), of a Llama-3.2-1B
//! shape (2048 wide, 8192
//! intermediate, 128 256 tokens) stored in bf16 and converted to f16, with
//! the threads rayon has. The figures are wall seconds and the f16 bytes
//! made per second; the checkpoint is written first (random weights) and
//! read from the page cache. With `PRUNEMEM_WEIGHT_LAYOUT=stored` the
//! layer's linears are left as stored (`model::prefetch::stored_layout`).
//!
//!   cargo run --release --example reader_rate -- [VOCAB]

use std::time::Instant;

use prunemem::model::synthetic::{SyntheticSpec, write_checkpoint};
use prunemem::model::{Checkpoint, ComputeDtype, vocab};

fn main() {
    let vocab: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(128_256);
    let dir = tempfile::tempdir().expect("a temporary folder");
    let spec = SyntheticSpec {
        hidden: 2048,
        intermediate: 8192,
        layers: 1,
        heads: 32,
        kv_heads: 8,
        vocab,
        dtype: safetensors::Dtype::BF16,
        ..Default::default()
    };
    write_checkpoint(dir.path(), &spec).expect("a synthetic checkpoint");
    let ckpt = Checkpoint::open(dir.path()).expect("the checkpoint opens");
    println!("threads: {}", rayon::current_num_threads());
    for run in 1..=3 {
        let t = Instant::now();
        let table = ckpt
            .read_converted("model.embed_tokens.weight", ComputeDtype::F16)
            .expect("the table");
        let table_s = t.elapsed().as_secs_f64();
        let t = Instant::now();
        let layer =
            prunemem::model::prefetch::read_layer(&ckpt, 0, ComputeDtype::F16).expect("the layer");
        let layer_s = t.elapsed().as_secs_f64();
        // The layer's conversion alone (no transposition).
        let t = Instant::now();
        let names: Vec<&String> = (ckpt.tensors.keys())
            .filter(|n| n.starts_with("model.layers.0."))
            .collect();
        for name in &names {
            ckpt.read_converted(name, ComputeDtype::F16)
                .expect("a tensor");
        }
        let convert_s = t.elapsed().as_secs_f64();
        // 32 × 512 tokens spread over the vocabulary (real text repeats
        // more of its tokens: fewer distinct rows).
        let tokens: Vec<u32> = (0..32 * 512u64)
            .map(|i| ((i * 2_654_435_761) % vocab as u64) as u32)
            .collect();
        let t = Instant::now();
        vocab::check_finite(&ckpt, vocab::EMBEDDING).expect("a finite table");
        let check_s = t.elapsed().as_secs_f64();
        let t = Instant::now();
        let rows = vocab::read_rows(&ckpt, vocab::EMBEDDING, &tokens, ComputeDtype::F16)
            .expect("the rows");
        let rows_s = t.elapsed().as_secs_f64();
        let t = Instant::now();
        let f32_table = ckpt.read_f32(vocab::EMBEDDING).expect("the table");
        let f32_s = t.elapsed().as_secs_f64();
        let t = Instant::now();
        let serial = serial_f32(&ckpt, vocab::EMBEDDING);
        let serial_s = t.elapsed().as_secs_f64();
        assert_eq!(serial.len(), f32_table.len());
        drop((serial, f32_table));
        let t = Instant::now();
        vocab::read_rows(&ckpt, vocab::EMBEDDING, &tokens[..256], ComputeDtype::F32)
            .expect("the rows");
        let probe_rows_s = t.elapsed().as_secs_f64();
        let gb = |b: u64, s: f64| b as f64 / s / 1e9;
        println!(
            "run {run}: GradProbe's f32 table {f32_s:.3} s on every core, {serial_s:.3} s on one; \
             its 2 x 128 rows {probe_rows_s:.4} s"
        );
        println!(
            "run {run}: table {:.3} s ({:.2} GB/s), layer {:.3} s ({:.2} GB/s; converted alone {:.3} s), \
             32 x 512 rows {:.3} s ({} MB) + the table's check {:.3} s",
            table_s,
            gb(table.bytes.len() as u64, table_s),
            layer_s,
            gb(layer.bytes(), layer_s),
            convert_s,
            rows_s,
            rows.bytes.len() >> 20,
            check_s,
        );
    }
}

/// The table in f32 decoded on one core, 8 MiB at a time, each piece
/// checked first: `Checkpoint::read_f32` before 2026-11-29.
fn serial_f32(ckpt: &Checkpoint, name: &str) -> Vec<f32> {
    use prunemem::model::dtype;
    let e = ckpt.entry(name).expect("the table");
    let bytes = ckpt.bytes(name).expect("the table");
    let mut out = Vec::with_capacity(bytes.len() / 2);
    for piece in bytes.chunks(8 << 20) {
        assert!(dtype::first_non_finite(piece, e.dtype).is_none());
        out.extend(dtype::decode_f32(piece, e.dtype));
    }
    out
}
