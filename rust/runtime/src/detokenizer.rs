//! Incremental detokenization of many requests at once, over a `tokenizers` tokenizer.
//!
//! Each request has a [`DecodeWindow`] (token ids to complete characters, O(new tokens) per
//! step). The text a request emits, pieces and final flush together, is
//! `tokenizer.decode(all_ids, skip_special_tokens)`. Stop strings are not decided here: the
//! scheduler finds them and the Python detokenizer stage cuts the text where it is told.

use std::collections::HashMap;
use std::path::Path;

use tokenizers::Tokenizer;

use crate::decode_window::{DecodeWindow, StreamDecoder};
use crate::error::{Error, Result};

/// Per-request settings, fixed when the request is added.
#[derive(Debug, Clone, Default)]
pub struct RequestOptions {
    /// Leave out special added tokens (`tokenizers`' `skip_special_tokens`).
    pub skip_special_tokens: bool,
    /// The last few prompt tokens: output text is decoded after them, so that the first output
    /// token keeps the leading space a decoder would strip at the start of a sequence. Ignored
    /// when their text ends in an incomplete character.
    pub context_ids: Vec<u32>,
}

/// State of one request.
#[derive(Debug)]
struct RequestState {
    window: DecodeWindow,
    finished: bool,
}

/// Turns streams of token ids into streams of text, for many requests keyed by request id.
pub struct IncrementalDetokenizer {
    decoder: StreamDecoder,
    requests: HashMap<String, RequestState>,
}

impl IncrementalDetokenizer {
    /// A detokenizer over an already loaded tokenizer.
    pub fn new(tokenizer: Tokenizer) -> Self {
        IncrementalDetokenizer {
            decoder: StreamDecoder::new(tokenizer),
            requests: HashMap::new(),
        }
    }

    /// Loads a Hugging Face `tokenizer.json`.
    pub fn from_file(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        let tokenizer = Tokenizer::from_file(path).map_err(|e| {
            Error::InvalidArgument(format!("cannot load tokenizer {}: {e}", path.display()))
        })?;
        Ok(Self::new(tokenizer))
    }

    /// The tokenizer this detokenizer decodes with.
    pub fn tokenizer(&self) -> &Tokenizer {
        self.decoder.tokenizer()
    }

    /// How many requests are held (added and not yet freed).
    pub fn num_requests(&self) -> usize {
        self.requests.len()
    }

    /// Whether request `rid` is held.
    pub fn contains(&self, rid: &str) -> bool {
        self.requests.contains_key(rid)
    }

    /// Starts request `rid`; fails if it is already held.
    pub fn add_request(&mut self, rid: &str, options: RequestOptions) -> Result<()> {
        if self.requests.contains_key(rid) {
            return Err(Error::InvalidArgument(format!(
                "request {rid:?} is already in the detokenizer"
            )));
        }
        let state = RequestState {
            window: DecodeWindow::new(
                &self.decoder,
                options.skip_special_tokens,
                options.context_ids,
            )?,
            finished: false,
        };
        self.requests.insert(rid.to_string(), state);
        Ok(())
    }

    /// Feeds the next token ids of `rid` and returns the text they complete.
    pub fn step(&mut self, rid: &str, new_ids: &[u32]) -> Result<String> {
        let state = self
            .requests
            .get_mut(rid)
            .ok_or_else(|| unknown_request(rid))?;
        step_request(&self.decoder, state, new_ids)
    }

    /// [`Self::step`] for many requests, in order; checks every id first, so an unknown id
    /// changes nothing. A request may appear more than once (its steps then run in order).
    pub fn step_batch<S: AsRef<str>>(
        &mut self,
        rids: &[S],
        new_ids: &[Vec<u32>],
    ) -> Result<Vec<String>> {
        if rids.len() != new_ids.len() {
            return Err(Error::InvalidArgument(format!(
                "{} request ids but {} id lists",
                rids.len(),
                new_ids.len()
            )));
        }
        if let Some(rid) = rids.iter().find(|rid| !self.contains(rid.as_ref())) {
            return Err(unknown_request(rid.as_ref()));
        }
        rids.iter()
            .zip(new_ids)
            .map(|(rid, ids)| self.step(rid.as_ref(), ids))
            .collect()
    }

    /// Ends `rid`: flushes the text held back (an incomplete character decodes to U+FFFD, as in
    /// `tokenizer.decode`). Later steps emit nothing; the request stays held until
    /// [`Self::free`].
    pub fn finish(&mut self, rid: &str) -> Result<String> {
        let state = self
            .requests
            .get_mut(rid)
            .ok_or_else(|| unknown_request(rid))?;
        if state.finished {
            return Ok(String::new());
        }
        state.finished = true;
        state.window.flush(&self.decoder)
    }

    /// Forgets `rid`, finished or not.
    pub fn free(&mut self, rid: &str) -> Result<()> {
        self.requests
            .remove(rid)
            .map(|_| ())
            .ok_or_else(|| unknown_request(rid))
    }
}

fn unknown_request(rid: &str) -> Error {
    Error::InvalidArgument(format!("request {rid:?} is not in the detokenizer"))
}

/// One step of one request; a finished request emits nothing.
fn step_request(
    decoder: &StreamDecoder,
    state: &mut RequestState,
    new_ids: &[u32],
) -> Result<String> {
    if state.finished {
        return Ok(String::new());
    }
    state.window.step(decoder, new_ids)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_tokenizer::{bytes_of, tokenizer, BOS, HELLO, WORLD, ZHONG_HEAD};

    fn detokenizer() -> IncrementalDetokenizer {
        IncrementalDetokenizer::new(tokenizer())
    }

    fn options(skip_special_tokens: bool) -> RequestOptions {
        RequestOptions {
            skip_special_tokens,
            ..RequestOptions::default()
        }
    }

    #[test]
    fn finish_flushes_an_incomplete_character_then_ends() {
        let mut detok = detokenizer();
        detok.add_request("r", RequestOptions::default()).unwrap();
        assert_eq!(detok.step("r", &[b'a'.into(), 0xE4]).unwrap(), "");
        assert_eq!(detok.finish("r").unwrap(), "a\u{FFFD}");
        assert_eq!(detok.step("r", &[b'b'.into()]).unwrap(), "");
        assert_eq!(detok.finish("r").unwrap(), "");
        assert!(detok.contains("r"));
    }

    #[test]
    fn batch_equals_sequential_steps() {
        let mut batched = detokenizer();
        let mut single = detokenizer();
        for detok in [&mut batched, &mut single] {
            detok.add_request("a", options(false)).unwrap();
            detok.add_request("b", options(true)).unwrap();
        }
        let rids = ["a", "b", "a"];
        let ids = [vec![HELLO], vec![BOS, ZHONG_HEAD], vec![WORLD]];
        let got = batched.step_batch(&rids, &ids).unwrap();
        let want: Vec<String> = rids
            .iter()
            .zip(&ids)
            .map(|(r, i)| single.step(r, i).unwrap())
            .collect();
        assert_eq!(got, want);
    }

    #[test]
    fn argument_errors() {
        let mut detok = detokenizer();
        detok.add_request("a", RequestOptions::default()).unwrap();
        let invalid = |r: Result<()>| matches!(r, Err(Error::InvalidArgument(_)));
        assert!(invalid(detok.add_request("a", RequestOptions::default())));
        assert!(invalid(detok.step("b", &[1]).map(|_| ())));
        assert!(invalid(detok.finish("b").map(|_| ())));
        assert!(invalid(detok.step_batch(&["a"], &[]).map(|_| ())));
        // An unknown id in a batch leaves every request untouched.
        let batch = [bytes_of("x"), vec![1]];
        assert!(invalid(detok.step_batch(&["a", "b"], &batch).map(|_| ())));
        assert_eq!(detok.step("a", &bytes_of("y")).unwrap(), "y");
        let missing = IncrementalDetokenizer::from_file("/nonexistent/tokenizer.json");
        assert!(invalid(missing.map(|_| ())));
        detok.free("a").unwrap();
        assert!(invalid(detok.free("a")));
        assert_eq!(detok.num_requests(), 0);
    }
}
