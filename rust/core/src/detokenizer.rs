//! Incremental detokenization of many requests at once, over a `tokenizers` tokenizer.
//!
//! Each request has a [`DecodeWindow`] (token ids to complete characters, O(new tokens) per
//! step) followed by a [`StopMatcher`] (stop strings, and the text held back because it could
//! still begin one). The text a request emits, pieces and final flush together, is
//! `tokenizer.decode(all_ids, skip_special_tokens)` cut at the first stop string to complete.

use std::collections::HashMap;
use std::path::Path;

use tokenizers::Tokenizer;

use crate::decode_window::{DecodeWindow, StreamDecoder};
use crate::error::{Error, Result};
use crate::stop::StopMatcher;

/// Per-request settings, fixed when the request is added.
#[derive(Debug, Clone, Default)]
pub struct RequestOptions {
    /// Leave out special added tokens (`tokenizers`' `skip_special_tokens`).
    pub skip_special_tokens: bool,
    /// Literal stop strings; the first to complete ends the text.
    pub stop: Vec<String>,
    /// Emit the matched stop string at the end of the text.
    pub include_stop_str_in_output: bool,
    /// The last few prompt tokens: output text is decoded after them, so that the first output
    /// token keeps the leading space a decoder would strip at the start of a sequence. Ignored
    /// when their text ends in an incomplete character.
    pub context_ids: Vec<u32>,
}

/// What one step (or the final flush) of a request produced.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StepOutput {
    /// New text, complete characters only.
    pub text: String,
    /// The stop string that ended the text, on the step where it matched: the request is
    /// finished and later steps emit nothing.
    pub matched_stop: Option<String>,
}

/// State of one request.
#[derive(Debug)]
struct RequestState {
    window: DecodeWindow,
    stop: StopMatcher,
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

    /// Starts request `rid`; fails if it is already held or a stop string is empty.
    pub fn add_request(&mut self, rid: &str, options: RequestOptions) -> Result<()> {
        if self.requests.contains_key(rid) {
            return Err(Error::InvalidArgument(format!(
                "request {rid:?} is already in the detokenizer"
            )));
        }
        let state = RequestState {
            stop: StopMatcher::new(options.stop, options.include_stop_str_in_output)?,
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
    pub fn step(&mut self, rid: &str, new_ids: &[u32]) -> Result<StepOutput> {
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
    ) -> Result<Vec<StepOutput>> {
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

    /// Ends `rid` without a stop string: flushes the text held back (an incomplete character
    /// decodes to U+FFFD, as in `tokenizer.decode`). Later steps emit nothing; the request stays
    /// held until [`Self::free`].
    pub fn finish(&mut self, rid: &str) -> Result<StepOutput> {
        let state = self
            .requests
            .get_mut(rid)
            .ok_or_else(|| unknown_request(rid))?;
        if state.finished {
            return Ok(StepOutput::default());
        }
        let text = state.window.flush(&self.decoder)?;
        let mut output = release(state, &text);
        if !state.finished {
            output.text.push_str(&state.stop.flush());
            state.finished = true;
        }
        Ok(output)
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

/// One step of one request: complete characters first, then stop strings.
fn step_request(
    decoder: &StreamDecoder,
    state: &mut RequestState,
    new_ids: &[u32],
) -> Result<StepOutput> {
    if state.finished {
        return Ok(StepOutput::default());
    }
    let text = state.window.step(decoder, new_ids)?;
    Ok(release(state, &text))
}

/// Passes decoded text through the stop matcher; a match finishes the request.
fn release(state: &mut RequestState, text: &str) -> StepOutput {
    let out = state.stop.push(text);
    if out.matched.is_some() {
        state.finished = true;
    }
    StepOutput {
        matched_stop: out.matched.map(|i| state.stop.stop(i).to_string()),
        text: out.text,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_tokenizer::{bytes_of, tokenizer, BOS, HELLO, WORLD, ZHONG_HEAD};

    fn detokenizer() -> IncrementalDetokenizer {
        IncrementalDetokenizer::new(tokenizer())
    }

    fn options(skip_special_tokens: bool, stop: &[&str]) -> RequestOptions {
        RequestOptions {
            skip_special_tokens,
            stop: stop.iter().map(|s| s.to_string()).collect(),
            ..RequestOptions::default()
        }
    }

    fn matched(text: &str, stop: &str) -> StepOutput {
        StepOutput {
            text: text.to_string(),
            matched_stop: Some(stop.to_string()),
        }
    }

    #[test]
    fn finish_flushes_an_incomplete_character_then_ends() {
        let mut detok = detokenizer();
        detok.add_request("r", RequestOptions::default()).unwrap();
        assert_eq!(detok.step("r", &[b'a'.into(), 0xE4]).unwrap().text, "");
        assert_eq!(detok.finish("r").unwrap().text, "a\u{FFFD}");
        assert_eq!(detok.step("r", &[b'b'.into()]).unwrap().text, "");
        assert_eq!(detok.finish("r").unwrap().text, "");
        assert!(detok.contains("r"));
    }

    #[test]
    fn stop_string_across_tokens_ends_the_request() {
        let mut detok = detokenizer();
        detok.add_request("r", options(false, &["lo wo"])).unwrap();
        assert_eq!(detok.step("r", &[HELLO]).unwrap().text, " hel");
        assert_eq!(detok.step("r", &[WORLD]).unwrap(), matched("", "lo wo"));
        assert_eq!(detok.step("r", &[HELLO]).unwrap(), StepOutput::default());
        assert_eq!(detok.finish("r").unwrap(), StepOutput::default());
    }

    #[test]
    fn stop_string_held_back_then_flushed_or_completed_by_finish() {
        let mut detok = detokenizer();
        detok.add_request("held", options(false, &["ab"])).unwrap();
        assert_eq!(detok.step("held", &bytes_of("xa")).unwrap().text, "x");
        assert_eq!(detok.finish("held").unwrap().text, "a");
        let opts = RequestOptions {
            include_stop_str_in_output: true,
            ..options(false, &["a"])
        };
        detok.add_request("done", opts).unwrap();
        // "xa" waits behind an incomplete character; only finish shows it the stop string.
        let ids = [b'x'.into(), b'a'.into(), 0xE4];
        assert_eq!(detok.step("done", &ids).unwrap().text, "");
        assert_eq!(detok.finish("done").unwrap(), matched("xa", "a"));
    }

    #[test]
    fn batch_equals_sequential_steps() {
        let mut batched = detokenizer();
        let mut single = detokenizer();
        for detok in [&mut batched, &mut single] {
            detok.add_request("a", options(false, &["wor"])).unwrap();
            detok.add_request("b", options(true, &[])).unwrap();
        }
        let rids = ["a", "b", "a"];
        let ids = [vec![HELLO], vec![BOS, ZHONG_HEAD], vec![WORLD]];
        let got = batched.step_batch(&rids, &ids).unwrap();
        let want: Vec<StepOutput> = rids
            .iter()
            .zip(&ids)
            .map(|(r, i)| single.step(r, i).unwrap())
            .collect();
        assert_eq!(got, want);
        assert_eq!(got[2], matched(" ", "wor"));
    }

    #[test]
    fn argument_errors() {
        let mut detok = detokenizer();
        detok.add_request("a", RequestOptions::default()).unwrap();
        let invalid = |r: Result<()>| matches!(r, Err(Error::InvalidArgument(_)));
        assert!(invalid(detok.add_request("a", RequestOptions::default())));
        assert!(invalid(detok.add_request("b", options(false, &[""]))));
        assert!(invalid(detok.step("b", &[1]).map(|_| ())));
        assert!(invalid(detok.finish("b").map(|_| ())));
        assert!(invalid(detok.step_batch(&["a"], &[]).map(|_| ())));
        // An unknown id in a batch leaves every request untouched.
        let batch = [bytes_of("x"), vec![1]];
        assert!(invalid(detok.step_batch(&["a", "b"], &batch).map(|_| ())));
        assert_eq!(detok.step("a", &bytes_of("y")).unwrap().text, "y");
        let missing = IncrementalDetokenizer::from_file("/nonexistent/tokenizer.json");
        assert!(invalid(missing.map(|_| ())));
        detok.free("a").unwrap();
        assert!(invalid(detok.free("a")));
        assert_eq!(detok.num_requests(), 0);
    }
}
