//! Loading a checkpoint layer after layer keeps about one layer resident: the
//! peak does not grow with the number of layers read, by either loader
//! (burn-store's adapter, which loads a resident model, and the reader's,
//! which the layer loops stream through). (Its own test binary,
//! so no other test allocates while RSS is measured.)

use burn::backend::Flex;
use prunemem::model::llama::DecoderLayer;
use prunemem::model::synthetic::{SyntheticSpec, write_checkpoint};
use prunemem::model::{Checkpoint, ComputeDtype, prefetch};

type FlexLayer = DecoderLayer<Flex>;

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
    type Load = fn(&Checkpoint, usize) -> FlexLayer;
    let loaders: [(&str, Load); 2] = [
        ("burn-store's adapter", |ckpt, i| {
            ckpt.load_layer::<Flex>(i, ComputeDtype::F32, &Default::default())
                .unwrap()
        }),
        ("the reader's", |ckpt, i| {
            prefetch::load_layer::<Flex>(ckpt, i, None, ComputeDtype::F32, &Default::default())
                .unwrap()
        }),
    ];
    for (name, load) in loaders {
        let ckpt = Checkpoint::open(dir.path()).unwrap();
        let layer = ckpt.layer_bytes(0);
        // Warm up allocator arenas with one load.
        drop(load(&ckpt, 0));
        let base = rss();
        let mut peak = 0;
        for i in 0..spec.layers {
            let l = load(&ckpt, i);
            peak = peak.max(rss().saturating_sub(base));
            drop(l);
        }
        let total = ckpt.stored_bytes();
        println!("{name}: layer {layer} B, file {total} B, peak growth {peak} B");
        assert!(
            peak < 3 * layer,
            "{name}: RSS grew {peak} B for {layer} B layers"
        );
        assert!(
            peak < total / 3,
            "{name}: RSS must not approach the file size"
        );
        assert_eq!(
            ckpt.bytes_read(),
            ckpt.layer_bytes(0) + (0..spec.layers).map(|i| ckpt.layer_bytes(i)).sum::<u64>(),
            "{name}"
        );
    }
}
