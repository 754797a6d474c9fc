//! A tiny byte-level BPE tokenizer for the detokenizer's unit tests: id b < 256 is byte b, so a
//! text's bytes are its ids; a few longer tokens and added tokens (two special, one not) follow.

use tokenizers::Tokenizer;

pub const HELLO: u32 = 256;
pub const WORLD: u32 = 257;
/// The first two bytes of 中.
pub const ZHONG_HEAD: u32 = 258;
/// The last byte of 中, then "x".
pub const ZHONG_TAIL_X: u32 = 259;
// Added tokens follow the model vocabulary.
pub const BOS: u32 = 260;
pub const IM_END: u32 = 261;
pub const EXTRA: u32 = 262;

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

/// The tokenizer, built from its `tokenizer.json` text.
pub fn tokenizer() -> Tokenizer {
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
    let added = [
        (BOS, "<s>", true),
        (IM_END, "<|im_end|>", true),
        (EXTRA, "<extra>", false),
    ]
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
    json.parse().unwrap()
}

/// The ids of `text` in this tokenizer: its bytes.
pub fn bytes_of(text: &str) -> Vec<u32> {
    text.bytes().map(u32::from).collect()
}
