//! Literal stop strings over a stream of text that arrives in arbitrary pieces.
//!
//! The matcher sees the text of one request piece by piece and decides what may be emitted.
//! What must stay true, whatever the piece boundaries:
//! - the match that *ends* first in the whole text wins (of those ending at the same place, the
//!   one that starts first): that is the match a stream notices first, so the outcome does not
//!   depend on how the text was split;
//! - nothing after the match is ever emitted (nor the match itself, unless
//!   `include_stop_str_in_output`);
//! - text that could still be the start of a stop string is held back until it cannot be, and
//!   [`StopMatcher::flush`] hands it out when the request ends another way.
//!
//! Held-back text is always shorter than the longest stop string, so each piece costs
//! O((held + piece) × stop strings) to search.

use crate::error::{Error, Result};

/// What one piece of text released: the text that may be emitted now and, when a stop string
/// completed in it, the index of that stop string in the matcher's list.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct StopOutput {
    /// Text that can no longer be part of a stop string (or ends with the matched one).
    pub text: String,
    /// Index of the stop string that ended the text, on the piece where it matched.
    pub matched: Option<usize>,
}

/// Stop-string state of one request. Stop strings are literal text, never patterns.
#[derive(Debug, Clone)]
pub struct StopMatcher {
    stops: Vec<String>,
    include_stop_str_in_output: bool,
    held: String,
    stopped: bool,
}

impl StopMatcher {
    /// A matcher for `stops`; rejects an empty stop string, which would match before any text.
    pub fn new(stops: Vec<String>, include_stop_str_in_output: bool) -> Result<Self> {
        if stops.iter().any(String::is_empty) {
            return Err(Error::InvalidArgument(
                "stop strings must not be empty".to_string(),
            ));
        }
        Ok(StopMatcher {
            stops,
            include_stop_str_in_output,
            held: String::new(),
            stopped: false,
        })
    }

    /// Whether a stop string has matched; from then on every piece is swallowed.
    pub fn stopped(&self) -> bool {
        self.stopped
    }

    /// The stop string at `index` (as reported in [`StopOutput::matched`]).
    pub fn stop(&self, index: usize) -> &str {
        &self.stops[index]
    }

    /// Takes the next piece of text and returns what may be emitted now.
    pub fn push(&mut self, piece: &str) -> StopOutput {
        if self.stopped {
            return StopOutput::default();
        }
        if self.stops.is_empty() {
            return StopOutput {
                text: piece.to_string(),
                matched: None,
            };
        }
        let mut buffer = std::mem::take(&mut self.held);
        buffer.push_str(piece);
        if let Some((index, start)) = self.first_match(&buffer) {
            let end = if self.include_stop_str_in_output {
                start + self.stops[index].len()
            } else {
                start
            };
            buffer.truncate(end);
            self.stopped = true;
            return StopOutput {
                text: buffer,
                matched: Some(index),
            };
        }
        let keep = self.longest_partial_suffix(&buffer);
        self.held = buffer.split_off(buffer.len() - keep);
        StopOutput {
            text: buffer,
            matched: None,
        }
    }

    /// Hands out the held-back text: the request ended without completing a stop string.
    pub fn flush(&mut self) -> String {
        std::mem::take(&mut self.held)
    }

    /// The match that ends first in `text` (ties: the one that starts first), as
    /// (stop index, byte start).
    fn first_match(&self, text: &str) -> Option<(usize, usize)> {
        let mut best: Option<(usize, usize, usize)> = None; // (end, start, index)
        for (index, stop) in self.stops.iter().enumerate() {
            if let Some(start) = text.find(stop.as_str()) {
                let candidate = (start + stop.len(), start, index);
                if best.is_none_or(|current| (candidate.0, candidate.1) < (current.0, current.1)) {
                    best = Some(candidate);
                }
            }
        }
        best.map(|(_, start, index)| (index, start))
    }

    /// Length in bytes of the longest suffix of `text` that is a proper prefix of a stop string.
    /// A stop-string prefix ends on a char boundary, so the suffix starts on one too.
    fn longest_partial_suffix(&self, text: &str) -> usize {
        let bytes = text.as_bytes();
        let mut longest = 0;
        for stop in &self.stops {
            let upper = (stop.len() - 1).min(bytes.len());
            for k in (longest + 1..=upper).rev() {
                if stop.is_char_boundary(k) && bytes.ends_with(&stop.as_bytes()[..k]) {
                    longest = k;
                    break;
                }
            }
        }
        longest
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn matcher(stops: &[&str], include: bool) -> StopMatcher {
        StopMatcher::new(stops.iter().map(|s| s.to_string()).collect(), include).unwrap()
    }

    /// Feeds `pieces` and returns (everything emitted, flushed or not, matched index).
    fn run(m: &mut StopMatcher, pieces: &[&str]) -> (String, Option<usize>) {
        let mut text = String::new();
        let mut matched = None;
        for piece in pieces {
            let out = m.push(piece);
            text.push_str(&out.text);
            if out.matched.is_some() {
                assert!(matched.is_none(), "a stop string matched twice");
                matched = out.matched;
            }
        }
        text.push_str(&m.flush());
        (text, matched)
    }

    #[test]
    fn empty_stop_string_is_rejected() {
        assert!(matches!(
            StopMatcher::new(vec!["".to_string()], false),
            Err(Error::InvalidArgument(_))
        ));
    }

    #[test]
    fn without_stops_text_passes_through() {
        let mut m = matcher(&[], false);
        assert_eq!(m.push("abc").text, "abc");
        assert_eq!(m.flush(), "");
    }

    #[test]
    fn match_across_pieces_cuts_the_text() {
        let mut m = matcher(&["STOP"], false);
        assert_eq!(m.push("hello ST").text, "hello ");
        let out = m.push("OP and more");
        assert_eq!(
            out,
            StopOutput {
                text: String::new(),
                matched: Some(0)
            }
        );
        assert!(m.stopped());
        assert_eq!(m.push("ignored").text, "");
        assert_eq!(m.flush(), "");
    }

    #[test]
    fn include_stop_str_keeps_the_match() {
        let mut m = matcher(&["STOP"], true);
        assert_eq!(
            run(&mut m, &["a S", "T", "OPb"]),
            ("a STOP".to_string(), Some(0))
        );
    }

    #[test]
    fn held_text_is_released_when_it_cannot_match() {
        let mut m = matcher(&["abc"], false);
        assert_eq!(m.push("xab").text, "x");
        assert_eq!(m.push("d").text, "abd");
    }

    #[test]
    fn incomplete_match_is_flushed() {
        let mut m = matcher(&["</answer>"], false);
        assert_eq!(run(&mut m, &["42 </ans"]), ("42 </ans".to_string(), None));
    }

    #[test]
    fn the_match_that_ends_first_wins() {
        // "xabc" starts first but "ab" ends first: a stream sees "ab" complete first.
        for pieces in [&["xabc"][..], &["x", "a", "b", "c"][..]] {
            let mut m = matcher(&["xabc", "ab"], false);
            assert_eq!(run(&mut m, pieces), ("x".to_string(), Some(1)));
        }
    }

    #[test]
    fn prefix_stops_and_ties_pick_the_earliest_start() {
        let mut m = matcher(&["bc", "abc"], false);
        assert_eq!(run(&mut m, &["zab", "c"]), ("z".to_string(), Some(1)));
        let mut m = matcher(&["ab", "abc"], true);
        assert_eq!(run(&mut m, &["zabc"]), ("zab".to_string(), Some(0)));
    }

    #[test]
    fn overlapping_stops_with_multibyte_text() {
        let mut m = matcher(&["日本語", "本当"], false);
        assert_eq!(
            run(&mut m, &["こんにちは日", "本", "当に"]),
            ("こんにちは日".to_string(), Some(1))
        );
        let mut m = matcher(&["日本語"], false);
        assert_eq!(run(&mut m, &["日本", "人"]), ("日本人".to_string(), None));
    }

    #[test]
    fn any_split_gives_the_same_result() {
        let text = "the cat sat on the mat, then stopped: END. more";
        let stops = ["mat, thenX", "the mat", "stopped", "END"];
        let mut whole = matcher(&stops, false);
        let expected = run(&mut whole, &[text]);
        assert_eq!(expected, ("the cat sat on ".to_string(), Some(1)));
        for size in 1..text.len() {
            let pieces: Vec<&str> = text
                .as_bytes()
                .chunks(size)
                .map(|c| std::str::from_utf8(c).unwrap())
                .collect();
            let mut m = matcher(&stops, false);
            assert_eq!(run(&mut m, &pieces), expected, "pieces of {size}");
        }
    }
}
