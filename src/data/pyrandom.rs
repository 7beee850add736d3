//! CPython's `random` module, as far as calibration sampling needs it:
//! `random.seed(int)` and `random.randint(a, b)`.
//!
//! The Wanda and SparseGPT scripts draw each calibration window's start with
//! `random.seed(seed)` then `random.randint(0, n - seqlen - 1)`. Reproducing
//! the generator bit for bit (MT19937, `init_by_array`, rejection sampling
//! in `_randbelow`) means prunemem picks the same windows as the reference
//! scripts for the same text and seed.

const N: usize = 624;
const M: usize = 397;

/// The Mersenne Twister as CPython seeds and uses it.
pub struct PyRandom {
    mt: [u32; N],
    index: usize,
}

impl PyRandom {
    /// `random.seed(seed)` for a non-negative integer seed.
    pub fn new(seed: u64) -> Self {
        // CPython splits abs(seed) into 32-bit words, least significant first;
        // zero becomes the single word 0.
        let mut key = Vec::new();
        let mut s = seed;
        loop {
            key.push((s & 0xffff_ffff) as u32);
            s >>= 32;
            if s == 0 {
                break;
            }
        }
        let mut r = Self {
            mt: [0; N],
            index: N,
        };
        r.init_by_array(&key);
        r
    }

    fn init_genrand(&mut self, s: u32) {
        self.mt[0] = s;
        for i in 1..N {
            let prev = self.mt[i - 1];
            self.mt[i] = 1_812_433_253u32
                .wrapping_mul(prev ^ (prev >> 30))
                .wrapping_add(i as u32);
        }
        self.index = N;
    }

    fn init_by_array(&mut self, key: &[u32]) {
        self.init_genrand(19_650_218);
        let (mut i, mut j) = (1usize, 0usize);
        for _ in 0..N.max(key.len()) {
            let prev = self.mt[i - 1];
            self.mt[i] = (self.mt[i] ^ (prev ^ (prev >> 30)).wrapping_mul(1_664_525))
                .wrapping_add(key[j])
                .wrapping_add(j as u32);
            i += 1;
            j += 1;
            if i >= N {
                self.mt[0] = self.mt[N - 1];
                i = 1;
            }
            if j >= key.len() {
                j = 0;
            }
        }
        for _ in 0..N - 1 {
            let prev = self.mt[i - 1];
            self.mt[i] = (self.mt[i] ^ (prev ^ (prev >> 30)).wrapping_mul(1_566_083_941))
                .wrapping_sub(i as u32);
            i += 1;
            if i >= N {
                self.mt[0] = self.mt[N - 1];
                i = 1;
            }
        }
        self.mt[0] = 0x8000_0000;
    }

    fn next_u32(&mut self) -> u32 {
        if self.index >= N {
            for k in 0..N {
                let y = (self.mt[k] & 0x8000_0000) | (self.mt[(k + 1) % N] & 0x7fff_ffff);
                let mut v = self.mt[(k + M) % N] ^ (y >> 1);
                if y & 1 != 0 {
                    v ^= 0x9908_b0df;
                }
                self.mt[k] = v;
            }
            self.index = 0;
        }
        let mut y = self.mt[self.index];
        self.index += 1;
        y ^= y >> 11;
        y ^= (y << 7) & 0x9d2c_5680;
        y ^= (y << 15) & 0xefc6_0000;
        y ^ (y >> 18)
    }

    /// `random.getrandbits(k)` for `k <= 64`.
    pub fn getrandbits(&mut self, k: u32) -> u64 {
        match k {
            0 => 0,
            1..=32 => (self.next_u32() >> (32 - k)) as u64,
            _ => {
                // CPython fills 32-bit words least significant first; the last
                // word keeps only its top bits.
                let low = self.next_u32() as u64;
                let high = (self.next_u32() >> (64 - k)) as u64;
                low | (high << 32)
            }
        }
    }

    /// `random.randint(a, b)`: uniform on `a..=b` by rejection sampling.
    pub fn randint(&mut self, a: u64, b: u64) -> u64 {
        let n = b - a + 1;
        let k = 64 - n.leading_zeros();
        loop {
            let r = self.getrandbits(k);
            if r < n {
                return a + r;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Values printed by CPython 3.11 for the same calls.
    #[test]
    fn matches_cpython() {
        let mut r = PyRandom::new(0);
        let bits: Vec<u64> = (0..4).map(|_| r.getrandbits(32)).collect();
        assert_eq!(bits, [3626764237, 1654615998, 3255389356, 3823568514]);
        let mut r = PyRandom::new(0);
        let starts: Vec<u64> = (0..5).map(|_| r.randint(0, 288931 - 512 - 1)).collect();
        assert_eq!(starts, [201979, 220500, 21225, 135746, 268055]);
        let mut r = PyRandom::new(1234);
        let v: Vec<u64> = (0..5).map(|_| r.randint(0, 1000)).collect();
        assert_eq!(v, [989, 796, 451, 119, 7]);
        let mut r = PyRandom::new((1u64 << 40) + 5);
        let v: Vec<u64> = (0..3).map(|_| r.randint(0, 1_000_000)).collect();
        assert_eq!(v, [528881, 542031, 281652]);
    }
}
