//! Host values into a device buffer, and back, through two fixed,
//! page-locked staging buffers, one filled (or emptied) on every core while
//! the other crosses the bus: the transfers cubecl 0.10 does not offer. Its `create_tensor` copies every
//! upload into a fresh pageable vector on the calling thread (a second
//! host copy, page faults included), and the CUDA server then copies from
//! pageable memory, which the driver stages itself and which waits for the
//! stream's earlier work first. The H100 runs moved layers at about 3 GB/s
//! that way (docs/gpu.md, "Uploads through page-locked memory").
//!
//! This module is the plan and the loop, apart from any driver: a tensor's
//! bytes cut into pieces that fit a staging buffer (whole rows where the
//! device pads its rows to a pitch), each piece copied into the buffer not
//! in flight and sent ([`send`]), or fetched into one buffer while the
//! other is copied out ([`receive`]). A [`Link`] is the driver's side (`exec::pinned` on
//! CUDA); the tests drive the loop with a host-memory link.

/// Where a tensor's rows lie in its device buffer: `rows` rows of
/// `row_bytes` each, `pitch` bytes apart (`pitch == row_bytes`: packed).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rows {
    pub rows: usize,
    pub row_bytes: usize,
    pub pitch: usize,
}

impl Rows {
    /// The layout of a tensor of `shape` with `elem` bytes per value and
    /// element `strides` as the device allocated it: `None` for a layout
    /// that is not rows at one pitch (only the last two dimensions may be
    /// padded, as cubecl's pitched policy pads them).
    pub fn of(shape: &[usize], strides: &[usize], elem: usize) -> Option<Rows> {
        let rank = shape.len();
        if rank == 0 || strides.len() != rank || strides[rank - 1] != 1 {
            return None;
        }
        let width = shape[rank - 1];
        let rows: usize = shape[..rank - 1].iter().product();
        let pitch = if rank > 1 { strides[rank - 2] } else { width };
        if pitch < width {
            return None;
        }
        // Outer dimensions step over whole padded rows.
        for d in (0..rank.saturating_sub(2)).rev() {
            if strides[d] != strides[d + 1] * shape[d + 1] {
                return None;
            }
        }
        Some(Rows {
            rows,
            row_bytes: width * elem,
            pitch: pitch * elem,
        })
    }

    pub fn packed(&self) -> bool {
        self.pitch == self.row_bytes
    }
}

/// One piece: `height` rows of `width` bytes, at `host` in the packed
/// host bytes and at `device` in the device buffer, rows `device_pitch`
/// bytes apart there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Piece {
    pub host: std::ops::Range<usize>,
    pub device: usize,
    pub width: usize,
    pub height: usize,
    pub device_pitch: usize,
}

/// `layout`'s bytes cut into pieces of at most `chunk` bytes: runs of the
/// packed bytes where the rows are packed, else runs of whole rows. `None`
/// where one padded row is larger than `chunk`.
pub fn pieces(layout: Rows, chunk: usize) -> Option<Vec<Piece>> {
    let total = layout.rows * layout.row_bytes;
    if total == 0 {
        return Some(Vec::new());
    }
    if layout.packed() {
        let starts = (0..total).step_by(chunk.max(1));
        return Some(
            starts
                .map(|a| {
                    let b = (a + chunk).min(total);
                    Piece {
                        host: a..b,
                        device: a,
                        width: b - a,
                        height: 1,
                        device_pitch: b - a,
                    }
                })
                .collect(),
        );
    }
    if layout.row_bytes > chunk {
        return None;
    }
    let per = chunk / layout.row_bytes;
    let starts = (0..layout.rows).step_by(per);
    Some(
        starts
            .map(|r| {
                let h = per.min(layout.rows - r);
                Piece {
                    host: r * layout.row_bytes..(r + h) * layout.row_bytes,
                    device: r * layout.pitch,
                    width: layout.row_bytes,
                    height: h,
                    device_pitch: layout.pitch,
                }
            })
            .collect(),
    )
}

/// The driver's side of a transfer: two staging buffers and a queue.
pub trait Link {
    /// Bytes each staging buffer holds.
    fn chunk(&self) -> usize;
    /// Blocks until staging buffer `k`'s last queued copy is done.
    fn wait(&mut self, k: usize) -> Result<(), String>;
    /// Staging buffer `k`, to be filled or read (after [`Link::wait`]).
    fn staging(&mut self, k: usize) -> &mut [u8];
    /// Queues `piece` out of staging buffer `k` (its bytes at the start)
    /// to the device.
    fn send(&mut self, k: usize, piece: &Piece) -> Result<(), String>;
    /// Queues `piece` from the device into staging buffer `k` (its bytes
    /// at the start).
    fn fetch(&mut self, k: usize, piece: &Piece) -> Result<(), String>;
    /// Blocks until everything queued is done.
    fn finish(&mut self) -> Result<(), String>;
}

/// 1 MiB per task of a copy on every core: big enough to amortise, small
/// enough to share.
const TASK: usize = 1 << 20;

fn par_copy(dst: &mut [u8], src: &[u8]) {
    use rayon::prelude::*;
    dst.par_chunks_mut(TASK)
        .zip(src.par_chunks(TASK))
        .for_each(|(d, s)| d.copy_from_slice(s));
}

/// `layout`'s pieces for a transfer of `len` host bytes through `link`.
fn plan(len: usize, layout: Rows, link: &impl Link) -> Result<Vec<Piece>, String> {
    if len != layout.rows * layout.row_bytes {
        return Err(format!(
            "{len} bytes for {} rows of {} bytes",
            layout.rows, layout.row_bytes
        ));
    }
    pieces(layout, link.chunk()).ok_or_else(|| format!("a row of {} bytes", layout.row_bytes))
}

/// Sends `bytes` (`layout`'s rows, packed) through `link`: each piece
/// copied on every core into the staging buffer not in flight, then
/// queued; returns once the last has arrived.
pub fn send(bytes: &[u8], layout: Rows, link: &mut impl Link) -> Result<(), String> {
    let pieces = plan(bytes.len(), layout, link)?;
    for (i, piece) in pieces.iter().enumerate() {
        let k = i % 2;
        link.wait(k)?;
        let src = &bytes[piece.host.clone()];
        par_copy(&mut link.staging(k)[..src.len()], src);
        link.send(k, piece)?;
    }
    link.finish()
}

/// Fills `out` (`layout`'s rows, packed) from the device through `link`:
/// the next piece is fetched into one staging buffer while the last is
/// copied out of the other on every core.
pub fn receive(out: &mut [u8], layout: Rows, link: &mut impl Link) -> Result<(), String> {
    let pieces = plan(out.len(), layout, link)?;
    if let Some(first) = pieces.first() {
        link.fetch(0, first)?;
    }
    for (i, piece) in pieces.iter().enumerate() {
        let k = i % 2;
        // The other buffer was emptied in the step before.
        if let Some(next) = pieces.get(i + 1) {
            link.fetch(1 - k, next)?;
        }
        link.wait(k)?;
        let dst = &mut out[piece.host.clone()];
        let n = dst.len();
        par_copy(dst, &link.staging(k)[..n]);
    }
    link.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A device buffer in host memory, with a log of the calls.
    struct HostLink {
        chunk: usize,
        staging: [Vec<u8>; 2],
        in_flight: [bool; 2],
        device: Vec<u8>,
        sent: usize,
    }

    impl HostLink {
        fn new(chunk: usize, device_bytes: usize) -> Self {
            Self {
                chunk,
                staging: [vec![0; chunk], vec![0; chunk]],
                in_flight: [false; 2],
                device: vec![0xEE; device_bytes],
                sent: 0,
            }
        }
    }

    impl Link for HostLink {
        fn chunk(&self) -> usize {
            self.chunk
        }
        fn wait(&mut self, k: usize) -> Result<(), String> {
            self.in_flight[k] = false;
            Ok(())
        }
        fn staging(&mut self, k: usize) -> &mut [u8] {
            assert!(!self.in_flight[k], "staging {k} filled while in flight");
            &mut self.staging[k]
        }
        fn send(&mut self, k: usize, p: &Piece) -> Result<(), String> {
            assert!(p.width * p.height <= self.chunk);
            for r in 0..p.height {
                let from = &self.staging[k][r * p.width..(r + 1) * p.width];
                let at = p.device + r * p.device_pitch;
                self.device[at..at + p.width].copy_from_slice(from);
            }
            self.in_flight[k] = true;
            self.sent += 1;
            Ok(())
        }
        fn fetch(&mut self, k: usize, p: &Piece) -> Result<(), String> {
            assert!(
                !self.in_flight[k],
                "staging {k} fetched into while in flight"
            );
            assert!(p.width * p.height <= self.chunk);
            for r in 0..p.height {
                let at = p.device + r * p.device_pitch;
                let from = &self.device[at..at + p.width];
                self.staging[k][r * p.width..(r + 1) * p.width].copy_from_slice(from);
            }
            self.in_flight[k] = true;
            self.sent += 1;
            Ok(())
        }
        fn finish(&mut self) -> Result<(), String> {
            self.in_flight = [false; 2];
            Ok(())
        }
    }

    fn upload(shape: &[usize], strides: &[usize], elem: usize, chunk: usize) -> (Vec<u8>, Vec<u8>) {
        let layout = Rows::of(shape, strides, elem).unwrap();
        let bytes: Vec<u8> = (0..layout.rows * layout.row_bytes)
            .map(|i| (i * 7 % 251) as u8)
            .collect();
        let mut link = HostLink::new(chunk, layout.rows * layout.pitch);
        send(&bytes, layout, &mut link).unwrap();
        let expected_pieces = pieces(layout, chunk).unwrap().len();
        assert_eq!(link.sent, expected_pieces);
        (bytes, link.device)
    }

    #[test]
    fn packed_tensors_arrive_whole_in_any_chunk() {
        for chunk in [1, 7, 64, 4096, 1 << 20] {
            let (bytes, device) = upload(&[3, 5, 11], &[55, 11, 1], 2, chunk);
            assert_eq!(bytes, device, "chunk {chunk}");
        }
        let (bytes, device) = upload(&[1000], &[1], 4, 300);
        assert_eq!(bytes, device);
    }

    #[test]
    fn pitched_rows_land_at_their_pitch_and_the_padding_is_left_alone() {
        // [2, 3, 5] f16 rows padded to 8 values: cubecl's pitched policy.
        let (shape, strides, elem) = ([2, 3, 5], [24, 8, 1], 2);
        for chunk in [10, 16, 25, 1 << 10] {
            let (bytes, device) = upload(&shape, &strides, elem, chunk);
            for r in 0..6 {
                let row = &device[r * 16..r * 16 + 10];
                assert_eq!(row, &bytes[r * 10..(r + 1) * 10], "chunk {chunk} row {r}");
                assert!(device[r * 16 + 10..(r + 1) * 16].iter().all(|&b| b == 0xEE));
            }
        }
    }

    #[test]
    fn what_goes_up_comes_back_the_same_packed_or_pitched() {
        for (shape, strides) in [([2, 3, 5], [24, 8, 1]), ([2, 3, 5], [15, 5, 1])] {
            for chunk in [10, 16, 25, 1 << 10] {
                let (bytes, device) = upload(&shape, &strides, 2, chunk);
                let layout = Rows::of(&shape, &strides, 2).unwrap();
                let mut link = HostLink::new(chunk, 0);
                link.device = device;
                let mut back = vec![0u8; bytes.len()];
                receive(&mut back, layout, &mut link).unwrap();
                assert_eq!(back, bytes, "{strides:?}, chunk {chunk}");
                assert_eq!(link.sent, pieces(layout, chunk).unwrap().len());
            }
        }
        let mut link = HostLink::new(8, 32);
        let layout = Rows {
            rows: 2,
            row_bytes: 12,
            pitch: 16,
        };
        assert!(
            receive(&mut [0; 24], layout, &mut link).is_err(),
            "a row past the chunk"
        );
    }

    #[test]
    fn layouts_that_are_not_rows_at_one_pitch_are_refused() {
        assert_eq!(
            Rows::of(&[4, 6], &[6, 1], 2),
            Some(Rows {
                rows: 4,
                row_bytes: 12,
                pitch: 12
            })
        );
        assert!(Rows::of(&[4, 6], &[1, 4], 2).is_none(), "transposed");
        assert!(
            Rows::of(&[4, 6], &[4, 1], 2).is_none(),
            "pitch below the width"
        );
        assert!(
            Rows::of(&[2, 4, 6], &[40, 8, 1], 2).is_none(),
            "a gap between matrices"
        );
        assert!(Rows::of(&[], &[], 2).is_none());
        // A padded row that no staging buffer holds.
        assert!(
            pieces(
                Rows {
                    rows: 2,
                    row_bytes: 12,
                    pitch: 16
                },
                8
            )
            .is_none()
        );
        let mut link = HostLink::new(8, 32);
        assert!(
            send(
                &[0; 24],
                Rows {
                    rows: 2,
                    row_bytes: 12,
                    pitch: 16
                },
                &mut link
            )
            .is_err()
        );
        assert!(
            send(
                &[0; 23],
                Rows {
                    rows: 2,
                    row_bytes: 12,
                    pitch: 12
                },
                &mut link
            )
            .is_err()
        );
    }
}
