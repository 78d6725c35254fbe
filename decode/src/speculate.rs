//! Speculative decoding's drafting and acceptance: a [`Drafter`] proposes up to K - 1
//! tokens to follow the context, one megakernel run verifies them with the last token (K
//! tokens per sequence), and the longest prefix of drafts agreeing with the kernel's
//! greedy ids is accepted ([`accepted`]); the ids are plain greedy decoding's whatever is
//! drafted, only the number of runs changes ([`crate::Decoder::generate_with`]).

/// Proposes the tokens expected to follow a context.
pub trait Drafter {
    /// Up to `max` tokens to follow `context` (the prompt and the `generated` ids so far).
    fn draft(&mut self, context: &[u32], generated: usize, max: usize) -> Vec<u32>;
}

/// Drafts nothing: plain greedy decoding, one token per run.
#[derive(Clone, Copy, Debug, Default)]
pub struct NoDrafts;

impl Drafter for NoDrafts {
    fn draft(&mut self, _: &[u32], _: usize, _: usize) -> Vec<u32> {
        Vec::new()
    }
}

/// Prompt-lookup (n-gram) drafting: the last `n` tokens of the context are looked up
/// earlier in it (the latest earlier occurrence wins, shorter suffixes down to one token
/// when `n` finds none), and the tokens that followed are proposed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ngram {
    pub n: usize,
}

impl Ngram {
    /// `ngram` and its default suffix length.
    pub const DEFAULT_N: usize = 3;
}

impl Drafter for Ngram {
    fn draft(&mut self, context: &[u32], _: usize, max: usize) -> Vec<u32> {
        for n in (1..=self.n.min(context.len().saturating_sub(1))).rev() {
            let suffix = &context[context.len() - n..];
            // Occurrences ending before the context's end, latest first.
            if let Some(start) =
                (0..context.len() - n).rev().find(|&s| &context[s..s + n] == suffix)
            {
                let follow = &context[start + n..];
                return follow[..follow.len().min(max)].to_vec();
            }
        }
        Vec::new()
    }
}

/// Forced drafts (`--draft-ids`, for tests): a proposed continuation of the prompt; each
/// run drafts its next ids past the ones generated so far.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Forced {
    pub continuation: Vec<u32>,
}

impl Drafter for Forced {
    fn draft(&mut self, _: &[u32], generated: usize, max: usize) -> Vec<u32> {
        let rest = self.continuation.get(generated..).unwrap_or(&[]);
        rest[..rest.len().min(max)].to_vec()
    }
}

/// How many of `drafts` are accepted: the longest prefix with each draft equal to the
/// greedy id the run chose at the token before it (`greedy[k]` follows fed token `k`;
/// fed token 0 is the last accepted one, token `k + 1` is `drafts[k]`).
pub fn accepted(drafts: &[u32], greedy: &[u32]) -> usize {
    drafts.iter().zip(greedy).take_while(|(d, g)| d == g).count()
}

/// Drafting's record over a generation.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Speculation {
    /// Decode runs (each verifying the last token and its drafts).
    pub runs: usize,
    pub drafted: usize,
    pub accepted: usize,
}

impl Speculation {
    pub(crate) fn record(&mut self, drafted: usize, accepted: usize) {
        self.runs += 1;
        self.drafted += drafted;
        self.accepted += accepted;
    }

    /// Accepted drafts per drafted token (0 when nothing was drafted).
    pub fn acceptance_rate(&self) -> f64 {
        if self.drafted == 0 { 0.0 } else { self.accepted as f64 / self.drafted as f64 }
    }

    /// Generated tokens per decode run: 1 + the accepted drafts per run.
    pub fn tokens_per_run(&self) -> f64 {
        if self.runs == 0 { 0.0 } else { (self.runs + self.accepted) as f64 / self.runs as f64 }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ngram_proposes_what_followed_the_latest_earlier_match() {
        let mut d = Ngram { n: 2 };
        // "7 8" occurred at 1 and 5; the latest earlier one (5) is followed by 1, 2.
        assert_eq!(d.draft(&[3, 7, 8, 9, 4, 7, 8, 1, 2, 7, 8], 0, 3), vec![1, 2, 7]);
        assert_eq!(d.draft(&[3, 7, 8, 9, 4, 7, 8, 1, 2, 7, 8], 0, 1), vec![1]);
        // No 2-gram match: the 1-gram "5" is.
        assert_eq!(d.draft(&[5, 6, 9, 5], 0, 4), vec![6, 9, 5]);
        assert_eq!(d.draft(&[1, 2, 3], 0, 4), Vec::<u32>::new());
        assert_eq!(d.draft(&[4], 0, 4), Vec::<u32>::new());
    }

    #[test]
    fn forced_drafts_follow_the_generated_ids() {
        let mut d = Forced { continuation: vec![10, 11, 12, 13] };
        assert_eq!(d.draft(&[], 0, 3), vec![10, 11, 12]);
        assert_eq!(d.draft(&[], 3, 3), vec![13]);
        assert_eq!(d.draft(&[], 9, 3), Vec::<u32>::new());
    }

    #[test]
    fn acceptance_is_the_agreeing_prefix() {
        assert_eq!(accepted(&[5, 6, 7], &[5, 6, 9, 1]), 2);
        assert_eq!(accepted(&[5, 6, 7], &[4, 6, 7, 1]), 0);
        assert_eq!(accepted(&[], &[4]), 0);
        let mut s = Speculation::default();
        s.record(3, 2);
        s.record(3, 0);
        assert_eq!((s.acceptance_rate(), s.tokens_per_run()), (2.0 / 6.0, 2.0));
    }
}
