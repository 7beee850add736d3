//! Loading a checkpoint layer after layer keeps about one layer resident: the
//! peak does not grow with the number of layers read. (Its own test binary,
//! so no other test allocates while RSS is measured.)

use burn::backend::Flex;
use prunemem::model::synthetic::{SyntheticSpec, write_checkpoint};
use prunemem::model::{Checkpoint, ComputeDtype};

fn rss() -> u64 {
    prunemem::memory::process::rss_now().unwrap()
}

#[test]
fn streaming_layers_keeps_one_layer_resident() {
    let dir = tempfile::tempdir().unwrap();
    let spec = SyntheticSpec {
        hidden: 512,
        intermediate: 1408,
        layers: 10,
        heads: 8,
        kv_heads: 2,
        seed: 5,
        ..Default::default()
    };
    write_checkpoint(dir.path(), &spec).unwrap();
    let ckpt = Checkpoint::open(dir.path()).unwrap();
    let layer = ckpt.layer_bytes(0);
    let device = Default::default();
    // Warm up allocator arenas with one load.
    drop(
        ckpt.load_layer::<Flex>(0, ComputeDtype::F32, &device)
            .unwrap(),
    );
    let base = rss();
    let mut peak = 0;
    for i in 0..spec.layers {
        let l = ckpt
            .load_layer::<Flex>(i, ComputeDtype::F32, &device)
            .unwrap();
        peak = peak.max(rss().saturating_sub(base));
        drop(l);
    }
    let total = ckpt.stored_bytes();
    println!("layer {layer} B, file {total} B, peak growth {peak} B");
    assert!(peak < 3 * layer, "RSS grew {peak} B for {layer} B layers");
    assert!(peak < total / 3, "RSS must not approach the file size");
    assert_eq!(
        ckpt.bytes_read(),
        ckpt.layer_bytes(0) + (0..spec.layers).map(|i| ckpt.layer_bytes(i)).sum::<u64>()
    );
}
