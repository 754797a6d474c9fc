//! Incremental detokenization of many requests at once, over a `tokenizers` tokenizer.
//!
//! Each request keeps a small window of token ids, in the manner of `tokenizers`' `DecodeStream`:
//! `ids[..read_offset]` are the tokens whose text was emitted last (the prefix, decoded to
//! `prefix_text`), `ids[read_offset..]` are tokens whose text is not out yet. A step decodes the
//! window and emits what the new tokens added after `prefix_text`; then the window drops
//! everything before `read_offset`. The window therefore stays a few tokens long and a step
//! costs O(new tokens), yet every token is decoded beside its left neighbour, so decoders that
//! look at context (a leading space stripped from the first token only, byte-fallback tokens
//! that only make a character together) behave as on the whole sequence.
//!
//! What must stay true:
//! - no incomplete UTF-8 character is emitted: a window whose text ends in U+FFFD is held until a
//!   later token completes the character (or [`IncrementalDetokenizer::finish`] gives up on it);
//! - the concatenation of everything emitted for a request equals
//!   `tokenizer.decode(all_ids, skip_special_tokens)`, or, with context ids, the text the output
//!   ids add after the context: `decode(context + ids)` minus `decode(context)`;
//! - stop strings are matched on that text by [`StopMatcher`], which also holds back text that
//!   could still begin one.

use std::collections::HashMap;
use std::path::Path;

use tokenizers::Tokenizer;

use crate::error::{Error, Result};
use crate::stop::StopMatcher;

/// What an incomplete UTF-8 sequence decodes to.
const REPLACEMENT: char = '\u{FFFD}';

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

/// Decode state of one request.
#[derive(Debug)]
struct RequestState {
    skip_special_tokens: bool,
    ids: Vec<u32>,
    read_offset: usize,
    prefix_text: String,
    stop: StopMatcher,
    finished: bool,
}

/// Turns streams of token ids into streams of text, for many requests keyed by request id.
pub struct IncrementalDetokenizer {
    tokenizer: Tokenizer,
    requests: HashMap<String, RequestState>,
}

impl IncrementalDetokenizer {
    /// A detokenizer over an already loaded tokenizer.
    pub fn new(tokenizer: Tokenizer) -> Self {
        IncrementalDetokenizer {
            tokenizer,
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
        &self.tokenizer
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
        let stop = StopMatcher::new(options.stop, options.include_stop_str_in_output)?;
        let mut ids = options.context_ids;
        let mut prefix_text = self.decode(&ids, options.skip_special_tokens)?;
        if prefix_text.ends_with(REPLACEMENT) {
            ids.clear();
            prefix_text.clear();
        }
        let state = RequestState {
            skip_special_tokens: options.skip_special_tokens,
            read_offset: ids.len(),
            ids,
            prefix_text,
            stop,
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
        step_request(&self.tokenizer, state, new_ids)
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
        let mut output = StepOutput::default();
        if state.ids.len() > state.read_offset {
            let text = decode(&self.tokenizer, &state.ids, state.skip_special_tokens)?;
            output = release(state, new_part(&text, &state.prefix_text));
        }
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

    fn decode(&self, ids: &[u32], skip_special_tokens: bool) -> Result<String> {
        decode(&self.tokenizer, ids, skip_special_tokens)
    }
}

fn unknown_request(rid: &str) -> Error {
    Error::InvalidArgument(format!("request {rid:?} is not in the detokenizer"))
}

fn decode(tokenizer: &Tokenizer, ids: &[u32], skip_special_tokens: bool) -> Result<String> {
    if ids.is_empty() {
        return Ok(String::new());
    }
    tokenizer
        .decode(ids, skip_special_tokens)
        .map_err(|e| Error::InvalidArgument(format!("cannot decode token ids: {e}")))
}

/// One step of one request: decode the window, emit what it added, slide the window.
fn step_request(
    tokenizer: &Tokenizer,
    state: &mut RequestState,
    new_ids: &[u32],
) -> Result<StepOutput> {
    if state.finished || new_ids.is_empty() {
        return Ok(StepOutput::default());
    }
    state.ids.extend_from_slice(new_ids);
    let text = decode(tokenizer, &state.ids, state.skip_special_tokens)?;
    // Hold while the last character may be incomplete, or while the new tokens added no text
    // (skipped special tokens): the window must keep a token with text for context.
    if text.ends_with(REPLACEMENT) || text.len() <= state.prefix_text.len() {
        return Ok(StepOutput::default());
    }
    let added = new_part(&text, &state.prefix_text).to_string();
    state.ids.drain(..state.read_offset);
    state.read_offset = state.ids.len();
    state.prefix_text = decode(tokenizer, &state.ids, state.skip_special_tokens)?;
    Ok(release(state, &added))
}

/// The text a window added after its prefix. Every decoder LLMs use is prefix-stable on a
/// window (the decoded prefix is a prefix of the decoded window); for any other, fall back to
/// cutting at the prefix's length, on a character boundary, as vLLM does.
fn new_part<'a>(text: &'a str, prefix_text: &str) -> &'a str {
    if let Some(added) = text.strip_prefix(prefix_text) {
        return added;
    }
    let mut cut = prefix_text.len().min(text.len());
    while !text.is_char_boundary(cut) {
        cut += 1;
    }
    &text[cut..]
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

    const BOS: u32 = 260; // added tokens follow the model vocabulary
    const IM_END: u32 = 261;
    const EXTRA: u32 = 262;
    const HELLO: u32 = 256;
    const WORLD: u32 = 257;
    const ZHONG_HEAD: u32 = 258; // the first two bytes of 中
    const ZHONG_TAIL_X: u32 = 259; // the last byte of 中, then "x"

    /// GPT-2's byte-to-character map, index = byte.
    fn byte_chars() -> Vec<char> {
        let printable = |b: u32| (33..=126).contains(&b) || (161..=172).contains(&b) || b >= 174;
        let mut next = 256;
        (0u32..256)
            .map(|b| {
                if printable(b) {
                    char::from_u32(b).unwrap()
                } else {
                    next += 1;
                    char::from_u32(next - 1).unwrap()
                }
            })
            .collect()
    }

    fn json_string(bytes: &[u8], chars: &[char]) -> String {
        let mut out = String::from("\"");
        for &b in bytes {
            match chars[b as usize] {
                '"' => out.push_str("\\\""),
                '\\' => out.push_str("\\\\"),
                c => out.push(c),
            }
        }
        out.push('"');
        out
    }

    /// A byte-level BPE tokenizer where id b < 256 is byte b, plus a few longer tokens and
    /// added tokens (two special, one not).
    fn detokenizer() -> IncrementalDetokenizer {
        let chars = byte_chars();
        let mut vocab: Vec<String> = (0u8..=255)
            .map(|b| format!("{}:{b}", json_string(&[b], &chars)))
            .collect();
        let longer: [(&[u8], u32); 4] = [
            (b" hello", HELLO),
            (b" world", WORLD),
            (&[0xE4, 0xB8], ZHONG_HEAD),
            (&[0xAD, b'x'], ZHONG_TAIL_X),
        ];
        for (bytes, id) in longer {
            vocab.push(format!("{}:{id}", json_string(bytes, &chars)));
        }
        let added = [(BOS, "<s>", true), (IM_END, "<|im_end|>", true), (EXTRA, "<extra>", false)]
            .map(|(id, content, special)| {
                format!(
                    r#"{{"id":{id},"content":"{content}","single_word":false,"lstrip":false,"rstrip":false,"normalized":false,"special":{special}}}"#
                )
            });
        let byte_level =
            r#"{"type":"ByteLevel","add_prefix_space":false,"trim_offsets":true,"use_regex":true}"#;
        let json = format!(
            r#"{{"version":"1.0","truncation":null,"padding":null,"added_tokens":[{}],"normalizer":null,"pre_tokenizer":{byte_level},"post_processor":null,"decoder":{byte_level},"model":{{"type":"BPE","dropout":null,"unk_token":null,"continuing_subword_prefix":null,"end_of_word_suffix":null,"fuse_unk":false,"byte_fallback":false,"vocab":{{{}}},"merges":[]}}}}"#,
            added.join(","),
            vocab.join(","),
        );
        IncrementalDetokenizer::new(json.parse().unwrap())
    }

    fn bytes_of(text: &str) -> Vec<u32> {
        text.bytes().map(u32::from).collect()
    }

    fn options(skip_special_tokens: bool, stop: &[&str]) -> RequestOptions {
        RequestOptions {
            skip_special_tokens,
            stop: stop.iter().map(|s| s.to_string()).collect(),
            ..RequestOptions::default()
        }
    }

    /// Steps `ids` in chunks of `chunk`, finishes, and returns the pieces emitted.
    fn pieces(
        detok: &mut IncrementalDetokenizer,
        rid: &str,
        ids: &[u32],
        chunk: usize,
    ) -> Vec<String> {
        let mut out: Vec<String> = ids
            .chunks(chunk)
            .map(|c| detok.step(rid, c).unwrap().text)
            .collect();
        out.push(detok.finish(rid).unwrap().text);
        out
    }

    #[test]
    fn multibyte_characters_are_emitted_whole() {
        let text = "héllo 👋 中文 e\u{301}";
        let ids = bytes_of(text);
        for chunk in 1..5 {
            let mut detok = detokenizer();
            detok.add_request("r", RequestOptions::default()).unwrap();
            let out = pieces(&mut detok, "r", &ids, chunk);
            assert!(out.iter().all(|p| !p.contains(REPLACEMENT)), "{out:?}");
            assert_eq!(out.concat(), text);
            assert!(
                detok.requests["r"].ids.len() <= 2 * chunk + 4,
                "the window must stay short"
            );
        }
    }

    #[test]
    fn tokens_that_split_a_character() {
        let ids = [HELLO, ZHONG_HEAD, ZHONG_TAIL_X, WORLD];
        let mut detok = detokenizer();
        detok.add_request("r", RequestOptions::default()).unwrap();
        let out = pieces(&mut detok, "r", &ids, 1);
        assert_eq!(out, [" hello", "", "中x", " world", ""]);
        assert_eq!(out.concat(), detok.tokenizer().decode(&ids, false).unwrap());
    }

    #[test]
    fn special_tokens_follow_skip_special_tokens() {
        let ids = [BOS, HELLO, IM_END, EXTRA, WORLD, IM_END];
        for (skip, expected) in [
            (false, "<s> hello<|im_end|><extra> world<|im_end|>"),
            (true, " hello<extra> world"),
        ] {
            let mut detok = detokenizer();
            detok.add_request("r", options(skip, &[])).unwrap();
            assert_eq!(pieces(&mut detok, "r", &ids, 1).concat(), expected);
            assert_eq!(detok.tokenizer().decode(&ids, skip).unwrap(), expected);
        }
    }

    #[test]
    fn finish_flushes_an_incomplete_character() {
        let mut detok = detokenizer();
        detok.add_request("r", RequestOptions::default()).unwrap();
        assert_eq!(detok.step("r", &[b'a'.into(), 0xE4]).unwrap().text, "");
        assert_eq!(detok.finish("r").unwrap().text, "a\u{FFFD}");
        assert_eq!(detok.step("r", &[b'b'.into()]).unwrap().text, "");
        assert_eq!(detok.finish("r").unwrap().text, "");
    }

    #[test]
    fn stop_string_across_tokens_ends_the_request() {
        let mut detok = detokenizer();
        detok.add_request("r", options(false, &["lo wo"])).unwrap();
        assert_eq!(detok.step("r", &[HELLO]).unwrap().text, " hel");
        let out = detok.step("r", &[WORLD]).unwrap();
        assert_eq!(
            out,
            StepOutput {
                text: String::new(),
                matched_stop: Some("lo wo".into())
            }
        );
        assert_eq!(detok.step("r", &[HELLO]).unwrap(), StepOutput::default());
        assert_eq!(detok.finish("r").unwrap(), StepOutput::default());
    }

    #[test]
    fn stop_string_completed_by_the_final_flush() {
        let mut detok = detokenizer();
        let opts = RequestOptions {
            include_stop_str_in_output: true,
            ..options(false, &["a"])
        };
        detok.add_request("r", opts).unwrap();
        assert_eq!(
            detok
                .step("r", &[b'x'.into(), b'a'.into(), 0xE4])
                .unwrap()
                .text,
            ""
        );
        let out = detok.finish("r").unwrap();
        assert_eq!(
            out,
            StepOutput {
                text: "xa".into(),
                matched_stop: Some("a".into())
            }
        );
    }

    #[test]
    fn context_ids_are_not_emitted() {
        let mut detok = detokenizer();
        let opts = RequestOptions {
            context_ids: vec![BOS, HELLO],
            ..RequestOptions::default()
        };
        detok.add_request("r", opts).unwrap();
        assert_eq!(
            pieces(&mut detok, "r", &[WORLD, ZHONG_HEAD, ZHONG_TAIL_X], 1).concat(),
            " world中x"
        );
        // A context that ends inside a character is dropped rather than half-emitted.
        let opts = RequestOptions {
            context_ids: vec![ZHONG_HEAD],
            ..RequestOptions::default()
        };
        detok.add_request("s", opts).unwrap();
        assert_eq!(
            pieces(&mut detok, "s", &[ZHONG_TAIL_X], 1).concat(),
            "\u{FFFD}x"
        );
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
        assert_eq!(got[2].matched_stop.as_deref(), Some("wor"));
    }

    #[test]
    fn argument_errors() {
        let mut detok = detokenizer();
        detok.add_request("a", RequestOptions::default()).unwrap();
        let invalid = |r: Result<_>| matches!(r, Err(Error::InvalidArgument(_)));
        assert!(invalid(detok.add_request("a", RequestOptions::default())));
        assert!(invalid(detok.add_request("b", options(false, &[""]))));
        assert!(invalid(detok.step("b", &[1]).map(|_| ())));
        assert!(invalid(detok.finish("b").map(|_| ())));
        assert!(invalid(detok.step_batch(&["a"], &[]).map(|_| ())));
        // An unknown id in a batch leaves every request untouched.
        assert!(invalid(
            detok
                .step_batch(&["a", "b"], &[bytes_of("x"), vec![1]])
                .map(|_| ())
        ));
        assert_eq!(detok.step("a", &bytes_of("y")).unwrap().text, "y");
        assert!(invalid(
            IncrementalDetokenizer::from_file("/nonexistent/tokenizer.json").map(|_| ())
        ));
        detok.free("a").unwrap();
        assert!(invalid(detok.free("a")));
        assert_eq!(detok.num_requests(), 0);
    }
}
