//! What a result carries: text, or text with images or tool references.
//!
//! Almost every result is text, and stays a plain `String` all the way out: [`ToolOutput`] and
//! [`ToolDispatchResult`](super::ToolDispatchResult) hold the text beside an
//! `Option<Box<[Block]>>` that is `None` for text, so the all-text path allocates nothing more
//! than before. Only a result with an image or a tool reference has blocks: its text, its images
//! and references, in order.
//!
//! * **Tool references** ([`Block::ToolReference`], what `tool_search` answers) are
//!   `{"type":"tool_reference","tool_name":…}` blocks on the Anthropic wire; in the text
//!   rendering (OpenAI tool messages, MCP) each is the tool's definition as JSON.
//!
//! * **Text rendering.** Every output also has a text form, used wherever images cannot go
//!   (OpenAI tool messages, error details, `content` fields read by text-only code): the text
//!   blocks joined with newlines, each image as a note such as
//!   `[image: image/png, 1148 bytes base64, not shown]`.
//! * **Output cap** ([`ToolOutput::capped`]). An image counts its base64 bytes. The text blocks
//!   count first; then images are kept in order while text plus kept images stay within the cap.
//!   An image that would pass the cap becomes its note (`…, not shown: over the 50000-byte output
//!   cap]`) on every wire. The text rendering is capped exactly as plain text is.
//! * **Accepted images.** Only the four types an Anthropic image block accepts — PNG, JPEG, GIF
//!   and WebP — whose data is valid standard base64 and starts with that format's signature.
//!   The media type sent is the one the signature names (a PNG labelled `image/jpeg` goes out as
//!   `image/png`, as the Messages API would otherwise refuse the whole request). Anything else
//!   becomes a note saying why.
//! * **Errors** are text: `Error [<code>]: <detail>`, with any image as its note.

use std::fmt;
use std::ops::Deref;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use serde::Serialize;
use serde_json::json;

use super::cap_output;

/// A piece of a result that has an image or a tool reference: text, one image, or one tool
/// reference.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Block {
    /// Text the model reads.
    Text(String),
    /// An image the model sees (where the wire carries images).
    Image(Image),
    /// A deferred tool the model may now load (what `tool_search` answers).
    ToolReference(ToolReference),
}

/// A reference to a deferred tool: its registry name, and its definition as text for wires
/// without tool references.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolReference {
    /// The tool's registry name.
    pub tool_name: String,
    /// The tool's definition (`{"name","description","input_schema"}` as JSON), what the text
    /// rendering shows.
    pub definition: String,
}

impl Block {
    /// A text block.
    pub fn text(text: impl Into<String>) -> Self {
        Block::Text(text.into())
    }

    /// An image block from base64 `data` (standard alphabet, padded) of type `media_type`
    /// (e.g. `image/png`).
    pub fn image(media_type: impl Into<String>, data: impl Into<String>) -> Self {
        Block::Image(Image {
            media_type: media_type.into(),
            data: data.into(),
        })
    }
}

impl Block {
    /// The block in the Anthropic Messages shape (what its `Serialize` writes).
    pub fn to_anthropic(&self) -> serde_json::Value {
        match self {
            Block::Text(text) => json!({"type": "text", "text": text}),
            Block::Image(image) => json!({"type": "image", "source": {
                "type": "base64", "media_type": image.media_type, "data": image.data,
            }}),
            Block::ToolReference(r) => json!({"type": "tool_reference", "tool_name": r.tool_name}),
        }
    }
}

/// An image, base64-encoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Image {
    /// `image/png`, `image/jpeg`, `image/gif` or `image/webp` (others become notes).
    pub media_type: String,
    /// The image's bytes in standard base64.
    pub data: String,
}

impl Image {
    /// The note that stands for this image in text: `[image: image/png, N bytes base64, not
    /// shown]`, with `: <why>` before the bracket when a reason is given.
    pub fn note(&self, why: Option<&str>) -> String {
        image_note(&self.media_type, self.data.len(), why)
    }

    /// The media type the data's signature names, if it is one an image block accepts and the
    /// data is valid base64; otherwise why not.
    fn checked_type(&self) -> Result<&'static str, String> {
        let bytes = STANDARD
            .decode(self.data.as_bytes())
            .map_err(|e| format!("its data is not valid base64 ({e})"))?;
        sniff(&bytes).ok_or_else(|| {
            format!(
                "{} data is not a PNG, JPEG, GIF or WebP image",
                self.media_type
            )
        })
    }
}

/// The note for an image of `media_type` whose base64 data is `len` bytes long (see
/// [`Image::note`]); also what the OpenAI provider writes for an image block in the history.
pub fn image_note(media_type: &str, len: usize, why: Option<&str>) -> String {
    match why {
        None => format!("[image: {media_type}, {len} bytes base64, not shown]"),
        Some(why) => format!("[image: {media_type}, {len} bytes base64, not shown: {why}]"),
    }
}

/// The media type of a PNG, JPEG, GIF or WebP image from its first bytes.
fn sniff(bytes: &[u8]) -> Option<&'static str> {
    if bytes.starts_with(b"\x89PNG\r\n\x1a\n") {
        Some("image/png")
    } else if bytes.starts_with(&[0xFF, 0xD8, 0xFF]) {
        Some("image/jpeg")
    } else if bytes.starts_with(b"GIF87a") || bytes.starts_with(b"GIF89a") {
        Some("image/gif")
    } else if bytes.len() >= 12 && bytes.starts_with(b"RIFF") && &bytes[8..12] == b"WEBP" {
        Some("image/webp")
    } else {
        None
    }
}

/// The text rendering of blocks: text as is, images as notes, joined with newlines.
fn render(blocks: &[Block]) -> String {
    let mut out = String::new();
    for (i, block) in blocks.iter().enumerate() {
        if i > 0 {
            out.push('\n');
        }
        match block {
            Block::Text(text) => out.push_str(text),
            Block::Image(image) => out.push_str(&image.note(None)),
            Block::ToolReference(r) => out.push_str(&r.definition),
        }
    }
    out
}

/// What a handler answers with: text (the common case, `"…".into()` / `String::into`), or text
/// and images ([`ToolOutput::blocks`]).
///
/// Derefs to (and compares with a string as) its text rendering.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ToolOutput {
    text: String,
    blocks: Option<Box<[Block]>>,
}

impl ToolOutput {
    /// Text only.
    pub fn text(text: impl Into<String>) -> Self {
        ToolOutput {
            text: text.into(),
            blocks: None,
        }
    }

    /// Text, images and tool references, in order. Empty text blocks are dropped; without an
    /// image or a reference this is the same as [`ToolOutput::text`] of the joined text.
    pub fn blocks(blocks: impl IntoIterator<Item = Block>) -> Self {
        let blocks: Vec<Block> = blocks
            .into_iter()
            .filter(|b| !matches!(b, Block::Text(t) if t.is_empty()))
            .collect();
        let text = render(&blocks);
        let has_more = blocks.iter().any(|b| !matches!(b, Block::Text(_)));
        ToolOutput {
            text,
            blocks: has_more.then(|| blocks.into_boxed_slice()),
        }
    }

    /// The text rendering (images as notes).
    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// The blocks, if the output has an image or a tool reference.
    pub fn images(&self) -> Option<&[Block]> {
        self.blocks.as_deref()
    }

    /// The text rendering, dropping any images.
    pub fn into_text(self) -> String {
        self.text
    }

    /// The text rendering and the blocks (`None` when there is no image or tool reference).
    pub fn into_parts(self) -> (String, Option<Box<[Block]>>) {
        (self.text, self.blocks)
    }

    /// The output within `cap` bytes (see the module docs for how images count). Text only: the
    /// same as [`cap_output`], with nothing allocated when nothing is cut.
    pub fn capped(self, cap: usize) -> ToolOutput {
        let Some(blocks) = self.blocks else {
            return ToolOutput::text(cap_output(self.text, cap));
        };
        let mut used: usize = blocks
            .iter()
            .map(|b| match b {
                Block::Text(t) => t.len(),
                Block::ToolReference(r) => r.tool_name.len(),
                Block::Image(_) => 0,
            })
            .sum();
        let references = blocks.iter().any(|b| matches!(b, Block::ToolReference(_)));
        let mut kept = Vec::with_capacity(blocks.len());
        let mut shown = 0usize;
        for block in blocks.into_vec() {
            let Block::Image(image) = block else {
                kept.push(block);
                continue;
            };
            match image.checked_type() {
                Err(why) => kept.push(Block::Text(image.note(Some(&why)))),
                Ok(_) if used.saturating_add(image.data.len()) > cap => kept.push(Block::Text(
                    image.note(Some(&format!("over the {cap}-byte output cap"))),
                )),
                Ok(media_type) => {
                    used += image.data.len();
                    shown += 1;
                    kept.push(Block::Image(Image {
                        media_type: media_type.to_string(),
                        data: image.data,
                    }));
                }
            }
        }
        // A tool reference's definition is JSON the model parses: it is never clamped like a
        // long line of output. Text blocks are clamped on their own; the whole is cut only past
        // the cap (a producer of references keeps within it: `tool_search` does).
        let text = if references {
            for block in &mut kept {
                if let Block::Text(t) = block {
                    *t = cap_output(std::mem::take(t), cap);
                }
            }
            let whole = render(&kept);
            if whole.len() <= cap {
                whole
            } else {
                cap_output(whole, cap)
            }
        } else {
            cap_output(render(&kept), cap)
        };
        if shown == 0 && !references {
            return ToolOutput::text(text);
        }
        // Within the cap as a whole, so only overlong lines are clamped. The Messages API
        // refuses a text block of only whitespace: such a block is left out.
        kept.retain(|b| !matches!(b, Block::Text(t) if t.trim().is_empty()));
        for block in &mut kept {
            if let Block::Text(t) = block {
                *t = cap_output(std::mem::take(t), cap);
            }
        }
        ToolOutput {
            text,
            blocks: Some(kept.into_boxed_slice()),
        }
    }
}

impl From<String> for ToolOutput {
    fn from(text: String) -> Self {
        ToolOutput::text(text)
    }
}

impl From<&String> for ToolOutput {
    fn from(text: &String) -> Self {
        ToolOutput::text(text.as_str())
    }
}

impl From<&str> for ToolOutput {
    fn from(text: &str) -> Self {
        ToolOutput::text(text)
    }
}

impl Deref for ToolOutput {
    type Target = str;
    fn deref(&self) -> &str {
        &self.text
    }
}

impl fmt::Display for ToolOutput {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

/// Compares the text rendering.
impl PartialEq<str> for ToolOutput {
    fn eq(&self, other: &str) -> bool {
        self.text == other
    }
}

impl PartialEq<&str> for ToolOutput {
    fn eq(&self, other: &&str) -> bool {
        self == *other
    }
}

impl PartialEq<String> for ToolOutput {
    fn eq(&self, other: &String) -> bool {
        self == other.as_str()
    }
}

/// A block in the Anthropic Messages shape: `{"type":"text","text":…}` or
/// `{"type":"image","source":{"type":"base64","media_type":…,"data":…}}`.
impl Serialize for Block {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        #[derive(Serialize)]
        #[serde(tag = "type", rename_all = "snake_case")]
        enum Wire<'a> {
            Text { text: &'a str },
            Image { source: Source<'a> },
            ToolReference { tool_name: &'a str },
        }
        #[derive(Serialize)]
        struct Source<'a> {
            #[serde(rename = "type")]
            kind: &'static str,
            media_type: &'a str,
            data: &'a str,
        }
        match self {
            Block::Text(text) => Wire::Text { text },
            Block::Image(image) => Wire::Image {
                source: Source {
                    kind: "base64",
                    media_type: &image.media_type,
                    data: &image.data,
                },
            },
            Block::ToolReference(r) => Wire::ToolReference {
                tool_name: &r.tool_name,
            },
        }
        .serialize(serializer)
    }
}

/// A `tool_result`'s `content`: a string, or (with an image) an array of blocks.
#[derive(Serialize)]
#[serde(untagged)]
pub(super) enum WireContent<'a> {
    Text(&'a str),
    Blocks(&'a [Block]),
}

impl<'a> WireContent<'a> {
    pub(super) fn of(text: &'a str, blocks: Option<&'a [Block]>) -> Self {
        match blocks {
            Some(blocks) => WireContent::Blocks(blocks),
            None => WireContent::Text(text),
        }
    }
}

/// A 1×1 PNG in base64, for tests.
#[cfg(test)]
pub(crate) const TINY_PNG: &str = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg==";

#[cfg(test)]
mod tests {
    use super::*;

    use super::TINY_PNG as PNG;

    #[test]
    fn text_output_is_plain_text() {
        let out = ToolOutput::from("hi");
        assert_eq!(out, "hi");
        assert_eq!(out.images(), None);
        assert_eq!(out.capped(10).into_parts(), ("hi".to_string(), None));
    }

    #[test]
    fn blocks_without_an_image_are_plain_text() {
        let out = ToolOutput::blocks([Block::text("a"), Block::text(""), Block::text("b")]);
        assert_eq!(out, "a\nb");
        assert_eq!(out.images(), None);
    }

    #[test]
    fn an_image_keeps_its_place_and_renders_as_a_note() {
        let out = ToolOutput::blocks([
            Block::text("before"),
            Block::image("image/png", PNG),
            Block::text("after"),
        ])
        .capped(50_000);
        let note = format!("[image: image/png, {} bytes base64, not shown]", PNG.len());
        assert_eq!(out.as_str(), format!("before\n{note}\nafter"));
        assert_eq!(
            out.images().unwrap(),
            &[
                Block::text("before"),
                Block::image("image/png", PNG),
                Block::text("after")
            ]
        );
    }

    #[test]
    fn an_image_past_the_cap_becomes_its_note_and_the_output_text() {
        let cap = 10 + PNG.len() - 1;
        let out = ToolOutput::blocks([Block::text("0123456789"), Block::image("image/png", PNG)])
            .capped(cap);
        assert_eq!(out.images(), None);
        assert_eq!(
            out.as_str(),
            format!(
                "0123456789\n[image: image/png, {} bytes base64, not shown: over the {cap}-byte output cap]",
                PNG.len()
            )
        );
        // One byte more and it fits exactly.
        let out = ToolOutput::blocks([Block::text("0123456789"), Block::image("image/png", PNG)])
            .capped(cap + 1);
        assert!(out.images().is_some());
    }

    #[test]
    fn images_count_in_order_until_the_cap_is_reached() {
        let out = ToolOutput::blocks([
            Block::image("image/png", PNG),
            Block::image("image/png", PNG),
        ])
        .capped(PNG.len() + 10);
        let blocks = out.images().unwrap();
        assert_eq!(blocks[0], Block::image("image/png", PNG));
        assert!(matches!(&blocks[1], Block::Text(t) if t.contains("over the")));
    }

    #[test]
    fn bad_or_unsupported_images_become_notes_saying_why() {
        let svg = STANDARD.encode("<svg/>");
        let out = ToolOutput::blocks([
            Block::image("image/png", "not base64!"),
            Block::image("image/svg+xml", svg),
        ])
        .capped(50_000);
        assert_eq!(out.images(), None);
        let lines: Vec<&str> = out.lines().collect();
        assert!(lines[0].contains("not valid base64"), "{}", lines[0]);
        assert!(
            lines[1].ends_with("image/svg+xml data is not a PNG, JPEG, GIF or WebP image]"),
            "{}",
            lines[1]
        );
    }

    #[test]
    fn whitespace_only_text_is_left_out_of_the_blocks() {
        let out =
            ToolOutput::blocks([Block::text(" \n"), Block::image("image/png", PNG)]).capped(50_000);
        assert_eq!(out.images().unwrap(), &[Block::image("image/png", PNG)]);
    }

    #[test]
    fn the_signature_decides_the_media_type() {
        let out = ToolOutput::blocks([Block::image("image/jpeg", PNG)]).capped(50_000);
        assert_eq!(out.images().unwrap(), &[Block::image("image/png", PNG)]);
    }

    #[test]
    fn blocks_serialize_in_the_anthropic_shape() {
        let blocks = [Block::text("t"), Block::image("image/png", "AAAA")];
        let values: Vec<_> = blocks.iter().map(Block::to_anthropic).collect();
        assert_eq!(serde_json::to_value(&blocks).unwrap(), json!(values));
        assert_eq!(
            serde_json::to_value(blocks).unwrap(),
            json!([
                {"type": "text", "text": "t"},
                {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"}}
            ])
        );
    }
}
