//! The median of the last few rate samples, the one smoothing both the
//! adaptive window (`credit/adaptive.rs`) and the TCP writer's refill
//! (`oxadb-io`'s `refill.rs`) apply: single delivery-rate samples spread
//! too widely (0.9 to 1.2 times the link at 10 ms, 0.9 to 6 GB/s on
//! loopback) for any one of them to decide.

/// The last `N` samples, oldest dropped first.
#[derive(Debug, Clone)]
pub struct RecentSamples<const N: usize> {
    samples: [u64; N],
    len: usize,
    next: usize,
}

impl<const N: usize> Default for RecentSamples<N> {
    fn default() -> Self {
        RecentSamples {
            samples: [0; N],
            len: 0,
            next: 0,
        }
    }
}

impl<const N: usize> RecentSamples<N> {
    /// Keeps `sample`, dropping the oldest once `N` are kept.
    pub fn push(&mut self, sample: u64) {
        self.samples[self.next] = sample;
        self.next = (self.next + 1) % N;
        self.len = (self.len + 1).min(N);
    }

    /// The median of the kept samples (the upper one of an even count),
    /// `None` before the first.
    pub fn median(&self) -> Option<u64> {
        if self.len == 0 {
            return None;
        }
        let mut sorted = self.samples;
        let kept = &mut sorted[..self.len];
        kept.sort_unstable();
        Some(kept[self.len / 2])
    }
}

#[cfg(test)]
mod tests {
    use super::RecentSamples;

    #[test]
    fn the_median_is_of_the_last_samples_only() {
        let mut recent = RecentSamples::<3>::default();
        assert_eq!(recent.median(), None);
        recent.push(10);
        assert_eq!(recent.median(), Some(10));
        recent.push(30);
        assert_eq!(recent.median(), Some(30), "the upper of two");
        recent.push(20);
        assert_eq!(recent.median(), Some(20));
        // 10 drops out: 30, 20, 1.
        recent.push(1);
        assert_eq!(recent.median(), Some(20));
        // 30 drops out: 20, 1, 2.
        recent.push(2);
        assert_eq!(recent.median(), Some(2));
    }
}
