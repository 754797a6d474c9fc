//! One request's incremental decode, in the manner of `tokenizers`' `DecodeStream`.
//!
//! The window holds a few token ids: `ids[..read_offset]` are the tokens whose text was emitted
//! last (the prefix, decoded to `prefix_text`), `ids[read_offset..]` are tokens whose text is
//! not out yet. A step decodes the window and emits what the new tokens added after
//! `prefix_text`; then the window drops everything before `read_offset`. The window therefore
//! stays a few tokens long and a step costs O(new tokens), yet every token is decoded beside
//! its left neighbour, so decoders that look at context (a leading space stripped from the
//! first token only, byte-fallback tokens that only make a character together) behave as on
//! the whole sequence.
//!
//! What must stay true: no incomplete UTF-8 character is emitted (a window whose text ends in
//! U+FFFD is held until a later token completes the character, or [`DecodeWindow::flush`] gives
//! up on it), and the concatenation of everything emitted equals
//! `tokenizer.decode(all_ids, skip_special_tokens)`, or, with context ids, the text the ids add
//! after the context: `decode(context + ids)` minus `decode(context)`.
//!
//! The hold is bounded. `tokenizers`' `DecodeStream` and vLLM's `detokenize_incrementally` hold
//! for as long as the text ends in U+FFFD, so a stream that never becomes valid UTF-8 (a
//! `logit_bias` forcing one lead byte forever) is held to the end and re-decoded whole at every
//! step: quadratic. A UTF-8 character has at most 4 bytes, and a token carries at least one, so
//! once more than [`MAX_PENDING`] tokens wait, those before the last [`KEEP_PENDING`] can no
//! longer be part of a character still to complete: their text, U+FFFD included, is emitted
//! (see [`DecodeWindow::give_up`]) and the window stays a few tokens long, whatever the stream.

use tokenizers::Tokenizer;

use crate::error::{Error, Result};

/// What an incomplete UTF-8 sequence decodes to.
const REPLACEMENT: char = '\u{FFFD}';

/// The most tokens a window holds back while their text is incomplete (or empty); past it, the
/// older ones are given up on. A character split over byte tokens completes with its 4th.
pub const MAX_PENDING: usize = 4;

/// The tokens still held back when the others are given up on: the bytes a character that began
/// before them may still be missing (at most 3, one token each at least).
pub const KEEP_PENDING: usize = 3;

/// How many cut points [`DecodeWindow::give_up`] tries, beyond the last [`KEEP_PENDING`], before
/// it emits the whole window.
const CUTS_TRIED: usize = 4;

/// How `Tokenizer::decode` treats an id.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum IdKind {
    /// Decoded.
    Text,
    /// A special added token: dropped when skipping special tokens.
    Special,
    /// No token has this id: always dropped.
    Unknown,
}

/// A tokenizer, plus what its `decode` drops: windows never take in an id that decode would
/// drop, so a run of skipped special tokens costs nothing and cannot grow a window.
pub struct StreamDecoder {
    tokenizer: Tokenizer,
    kinds: Vec<IdKind>,
}

impl StreamDecoder {
    /// Classifies every id up to the largest, the way `decode` looks ids up (added tokens
    /// first, then the model) and recognises special tokens (by their text).
    pub fn new(tokenizer: Tokenizer) -> Self {
        let largest = tokenizer.get_vocab(true).into_values().max();
        let added = tokenizer.get_added_vocabulary();
        let kinds = largest
            .map_or(0..0, |largest| 0..largest + 1)
            .map(|id| match tokenizer.id_to_token(id) {
                None => IdKind::Unknown,
                Some(token) if added.is_special_token(&token) => IdKind::Special,
                Some(_) => IdKind::Text,
            })
            .collect();
        StreamDecoder { tokenizer, kinds }
    }

    /// The tokenizer this decoder decodes with.
    pub fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }

    fn keeps(&self, id: u32, skip_special_tokens: bool) -> bool {
        match self.kinds.get(id as usize) {
            Some(IdKind::Text) => true,
            Some(IdKind::Special) => !skip_special_tokens,
            Some(IdKind::Unknown) | None => false,
        }
    }

    fn decode(&self, ids: &[u32], skip_special_tokens: bool) -> Result<String> {
        if ids.is_empty() {
            return Ok(String::new());
        }
        self.tokenizer
            .decode(ids, skip_special_tokens)
            .map_err(|e| Error::InvalidArgument(format!("cannot decode token ids: {e}")))
    }
}

/// The decode state of one request.
#[derive(Debug, Clone)]
pub struct DecodeWindow {
    skip_special_tokens: bool,
    ids: Vec<u32>,
    read_offset: usize,
    prefix_text: String,
}

impl DecodeWindow {
    /// A window that decodes after `context_ids` (the last few prompt tokens; ignored when their
    /// text ends in an incomplete character, which the output would otherwise complete).
    pub fn new(
        decoder: &StreamDecoder,
        skip_special_tokens: bool,
        context_ids: Vec<u32>,
    ) -> Result<Self> {
        let mut ids = context_ids;
        ids.retain(|&id| decoder.keeps(id, skip_special_tokens));
        let mut prefix_text = decoder.decode(&ids, skip_special_tokens)?;
        if prefix_text.ends_with(REPLACEMENT) {
            ids.clear();
            prefix_text.clear();
        }
        Ok(DecodeWindow {
            skip_special_tokens,
            read_offset: ids.len(),
            ids,
            prefix_text,
        })
    }

    /// How many ids the window holds (a few, whatever the length of the sequence).
    pub fn len(&self) -> usize {
        self.ids.len()
    }

    /// Whether the window holds no ids (only before the first step without context).
    pub fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }

    /// Feeds the next ids; returns the text they complete (possibly empty).
    pub fn step(&mut self, decoder: &StreamDecoder, new_ids: &[u32]) -> Result<String> {
        let held = self.ids.len();
        let skip = self.skip_special_tokens;
        self.ids
            .extend(new_ids.iter().filter(|&&id| decoder.keeps(id, skip)));
        if self.ids.len() == held {
            return Ok(String::new());
        }
        let text = decoder.decode(&self.ids, skip)?;
        // Hold while the last character may be incomplete, or while the new tokens added no
        // text: the prefix must keep a token with text for context.
        if !text.ends_with(REPLACEMENT) && text.len() > self.prefix_text.len() {
            return self.slide(decoder, &text);
        }
        if self.ids.len() - self.read_offset <= MAX_PENDING {
            return Ok(String::new());
        }
        self.give_up(decoder, &text)
    }

    /// Emits the text of the pending tokens up to a cut where it can no longer change (U+FFFD
    /// stays U+FFFD), and makes them the prefix. `text` is the decoded window.
    ///
    /// A cut is taken when the window's text after it is the same whether decoded after the
    /// old prefix or after the tokens to emit only (the context of the next steps): else a
    /// character, or an invalid sequence (one U+FFFD), straddles it. And it must stay so
    /// whatever comes next: either the text before the cut ends in a whole character, or
    /// [`KEEP_PENDING`] tokens follow it, enough to complete any character begun before it. The
    /// latest such cut among the few tried is taken; when none is (a decoder that rewrites text
    /// further back than a few tokens), the whole window is emitted, as [`DecodeWindow::flush`]
    /// would: the text may then differ from the whole decode, but the window stays short.
    fn give_up(&mut self, decoder: &StreamDecoder, text: &str) -> Result<String> {
        let skip = self.skip_special_tokens;
        let pending = decoder.decode(&self.ids[self.read_offset..], skip)?;
        let cuts = (self.read_offset + 1..self.ids.len()).rev();
        for cut in cuts.take(KEEP_PENDING + CUTS_TRIED) {
            let emitted = decoder.decode(&self.ids[..cut], skip)?;
            if cut + KEEP_PENDING > self.ids.len() && emitted.ends_with(REPLACEMENT) {
                continue;
            }
            let prefix_text = decoder.decode(&self.ids[self.read_offset..cut], skip)?;
            let after = text.strip_prefix(emitted.as_str());
            if after.is_some() && after == pending.strip_prefix(prefix_text.as_str()) {
                let added = new_part(&emitted, &self.prefix_text).to_string();
                self.ids.drain(..self.read_offset);
                self.read_offset = cut - self.read_offset;
                self.prefix_text = prefix_text;
                return Ok(added);
            }
        }
        self.slide(decoder, text)
    }

    /// Returns the text held back, an incomplete character as U+FFFD (as `decode` gives it),
    /// and empties the window of pending ids.
    pub fn flush(&mut self, decoder: &StreamDecoder) -> Result<String> {
        if self.ids.len() == self.read_offset {
            return Ok(String::new());
        }
        let text = decoder.decode(&self.ids, self.skip_special_tokens)?;
        self.slide(decoder, &text)
    }

    /// Emits what `text` (the decoded window) adds after the prefix, and makes the ids just
    /// emitted the new prefix.
    fn slide(&mut self, decoder: &StreamDecoder, text: &str) -> Result<String> {
        let added = new_part(text, &self.prefix_text).to_string();
        self.ids.drain(..self.read_offset);
        self.read_offset = self.ids.len();
        self.prefix_text = decoder.decode(&self.ids, self.skip_special_tokens)?;
        Ok(added)
    }
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_tokenizer::{
        bytes_of, tokenizer, BOS, EXTRA, HELLO, IM_END, WORLD, ZHONG_HEAD, ZHONG_TAIL_X,
    };

    /// Steps `ids` in chunks of `chunk`, flushes, and returns the pieces emitted.
    fn pieces(
        window: &mut DecodeWindow,
        tok: &StreamDecoder,
        ids: &[u32],
        chunk: usize,
    ) -> Vec<String> {
        let mut out: Vec<String> = ids
            .chunks(chunk)
            .map(|c| window.step(tok, c).unwrap())
            .collect();
        out.push(window.flush(tok).unwrap());
        out
    }

    #[test]
    fn multibyte_characters_are_emitted_whole() {
        let tok = StreamDecoder::new(tokenizer());
        let text = "héllo 👋 中文 e\u{301}";
        for chunk in 1..5 {
            let mut window = DecodeWindow::new(&tok, false, vec![]).unwrap();
            let out = pieces(&mut window, &tok, &bytes_of(text), chunk);
            assert!(out.iter().all(|p| !p.contains(REPLACEMENT)), "{out:?}");
            assert_eq!(out.concat(), text);
            assert!(window.len() <= 2 * chunk + 4, "the window must stay short");
        }
    }

    #[test]
    fn tokens_that_split_a_character() {
        let tok = StreamDecoder::new(tokenizer());
        let ids = [HELLO, ZHONG_HEAD, ZHONG_TAIL_X, WORLD];
        let mut window = DecodeWindow::new(&tok, false, vec![]).unwrap();
        let out = pieces(&mut window, &tok, &ids, 1);
        assert_eq!(out, [" hello", "", "中x", " world", ""]);
        assert_eq!(out.concat(), tok.tokenizer().decode(&ids, false).unwrap());
    }

    #[test]
    fn special_tokens_follow_skip_special_tokens() {
        let tok = StreamDecoder::new(tokenizer());
        let ids = [BOS, HELLO, IM_END, EXTRA, WORLD, IM_END];
        for (skip, expected) in [
            (false, "<s> hello<|im_end|><extra> world<|im_end|>"),
            (true, " hello<extra> world"),
        ] {
            let mut window = DecodeWindow::new(&tok, skip, vec![]).unwrap();
            assert_eq!(pieces(&mut window, &tok, &ids, 1).concat(), expected);
            assert_eq!(tok.tokenizer().decode(&ids, skip).unwrap(), expected);
        }
    }

    #[test]
    fn ids_that_decode_drops_never_enter_the_window() {
        let tok = StreamDecoder::new(tokenizer());
        let mut ids = vec![HELLO];
        ids.extend([BOS, 10_000].repeat(200));
        ids.push(WORLD);
        for skip in [true, false] {
            let mut window = DecodeWindow::new(&tok, skip, vec![BOS, 10_000]).unwrap();
            let out = pieces(&mut window, &tok, &ids, 1);
            assert_eq!(out.concat(), tok.tokenizer().decode(&ids, skip).unwrap());
            assert!(
                window.len() <= 2,
                "skipped and unknown ids must not pile up"
            );
        }
    }

    #[test]
    fn flush_gives_up_on_an_incomplete_character() {
        let tok = StreamDecoder::new(tokenizer());
        let mut window = DecodeWindow::new(&tok, false, vec![]).unwrap();
        assert_eq!(window.step(&tok, &[b'a'.into(), 0xE4]).unwrap(), "");
        assert_eq!(window.flush(&tok).unwrap(), "a\u{FFFD}");
        assert_eq!(window.flush(&tok).unwrap(), "");
    }

    #[test]
    fn context_ids_are_not_emitted() {
        let tok = StreamDecoder::new(tokenizer());
        let mut window = DecodeWindow::new(&tok, false, vec![BOS, HELLO]).unwrap();
        let ids = [WORLD, ZHONG_HEAD, ZHONG_TAIL_X];
        assert_eq!(pieces(&mut window, &tok, &ids, 1).concat(), " world中x");
        // A context that ends inside a character is dropped rather than half-emitted.
        let mut window = DecodeWindow::new(&tok, false, vec![ZHONG_HEAD]).unwrap();
        assert!(window.is_empty());
        assert_eq!(
            pieces(&mut window, &tok, &[ZHONG_TAIL_X], 1).concat(),
            "\u{FFFD}x"
        );
    }

    #[test]
    fn a_lead_byte_forever_comes_out_as_replacement_characters_in_a_short_window() {
        let tok = StreamDecoder::new(tokenizer());
        let mut window = DecodeWindow::new(&tok, false, vec![]).unwrap();
        let mut streamed = String::new();
        for _ in 0..10_000 {
            // 0xE4 begins a 3-byte character; a second one means the first can never complete.
            streamed.push_str(&window.step(&tok, &[0xE4]).unwrap());
            assert!(
                window.len() <= MAX_PENDING + KEEP_PENDING,
                "the window grew to {} ids",
                window.len()
            );
        }
        assert!(streamed.chars().all(|c| c == REPLACEMENT));
        let held = window.flush(&tok).unwrap();
        assert!(held.chars().count() <= MAX_PENDING, "{held:?}");
        streamed.push_str(&held);
        assert_eq!(
            streamed,
            tok.tokenizer().decode(&[0xE4; 10_000], false).unwrap()
        );
        assert_eq!(streamed.chars().count(), 10_000);
    }

    #[test]
    fn streams_with_invalid_bytes_still_equal_the_whole_decode() {
        let tok = StreamDecoder::new(tokenizer());
        // Runs of invalid and incomplete bytes between whole and split characters, in chunks of
        // every size: giving up on bytes must never cut a character that still completes.
        let bytes: [u8; 12] = [
            0xE4, 0xE4, 0xF0, 0x9F, 0x98, 0xE4, 0xE4, 0xE4, 0xF0, 0x9F, 0x98, 0x80,
        ];
        let mut ids: Vec<u32> = bytes.iter().map(|&b| u32::from(b)).collect();
        ids.extend([
            ZHONG_HEAD,
            0xAD,
            0xE4,
            0xE4,
            0xE4,
            0xE4,
            ZHONG_HEAD,
            ZHONG_TAIL_X,
        ]);
        ids.extend(bytes_of("ok 👋"));
        ids.extend([0xBF; 6]);
        ids.extend([
            0xF0, 0x9F, 0x8E, 0xE4, 0xE4, 0xE4, 0xE4, 0xE4, 0xF0, 0x9F, 0x8E, 0x89,
        ]);
        let whole = tok.tokenizer().decode(&ids, false).unwrap();
        assert!(whole.contains('😀') && whole.contains('🎉') && whole.contains('中'));
        for chunk in 1..8 {
            for start in 0..ids.len() {
                let ids = &ids[start..];
                let mut window = DecodeWindow::new(&tok, false, vec![]).unwrap();
                let out = pieces(&mut window, &tok, ids, chunk);
                let reference = tok.tokenizer().decode(ids, false).unwrap();
                assert_eq!(out.concat(), reference, "chunk {chunk}, from {start}");
            }
        }
    }

    #[test]
    fn prefix_instability_falls_back_to_the_prefix_length() {
        assert_eq!(new_part("abcdef", "abc"), "def");
        assert_eq!(new_part("xbcdef", "abc"), "def");
        assert_eq!(new_part("中文", "a"), "文");
        assert_eq!(new_part("ab", "abc"), "");
    }
}
