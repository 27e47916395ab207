//! Normalisation and validation of every name a request carries: workspace names, paths,
//! list prefixes and request ids. This is the only module that decides what a valid name is;
//! everything past the service boundary holds names that passed through here.
//!
//! Paths are relative UTF-8 with `/` separators. A single trailing `/` and repeated `/` are
//! *not* silently fixed: a path names exactly one entry, so ambiguous spellings are refused
//! rather than normalised into a different key.
//!
//! Lookalike names: paths and prefixes are normalised to Unicode NFC here, so the composed and
//! the decomposed spelling of `é` name the same entry (a user cannot tell them apart in `ls`,
//! and every common input method produces NFC). Unicode *format* characters (general category
//! Cf: bidi controls, zero-width joiners and spaces, the BOM, ...) are refused: they are
//! invisible and exist only to change how text is shown, so a name containing one is a name
//! that looks like another. Both rules apply to every name before it reaches a shard, so keys,
//! replay fingerprints and list order only ever see the normalised form.

use std::borrow::Cow;

use unicode_normalization::{IsNormalized, UnicodeNormalization, is_nfc_quick};

use crate::error::{Error, Result};

pub use nokv_proto::MAX_PATH_BYTES;
pub const MAX_COMPONENT_BYTES: usize = 255;
pub const MAX_REQUEST_ID_BYTES: usize = 128;

/// A workspace name: `[a-z0-9][a-z0-9._-]{0,62}`.
pub fn workspace(name: &str) -> Result<&str> {
    let bytes = name.as_bytes();
    let ok_first = |b: u8| b.is_ascii_lowercase() || b.is_ascii_digit();
    let ok_rest = |b: u8| ok_first(b) || matches!(b, b'.' | b'_' | b'-');
    if bytes.is_empty() {
        return Err(invalid("workspace name is empty"));
    }
    if bytes.len() > 63 {
        return Err(invalid("workspace name is longer than 63 bytes"));
    }
    if !ok_first(bytes[0]) || !bytes[1..].iter().all(|&b| ok_rest(b)) {
        return Err(invalid(format!(
            "workspace name {name:?} must match [a-z0-9][a-z0-9._-]{{0,62}}"
        )));
    }
    Ok(name)
}

/// A path naming one entry inside a workspace, in NFC; the returned form is the entry's key.
pub fn path(p: &str) -> Result<Cow<'_, str>> {
    let p = nfc(p);
    check_path(&p)?;
    Ok(p)
}

fn check_path(p: &str) -> Result<()> {
    if p.is_empty() {
        return Err(invalid("path is empty"));
    }
    if p.len() > MAX_PATH_BYTES {
        return Err(invalid(format!(
            "path is longer than {MAX_PATH_BYTES} bytes"
        )));
    }
    if p.starts_with('/') {
        return Err(invalid("path must be relative (starts with '/')"));
    }
    check_chars(p, "path")?;
    for component in p.split('/') {
        match component {
            "" => return Err(invalid(format!("path {p:?} has an empty component"))),
            "." | ".." => {
                return Err(invalid(format!("path {p:?} has a '{component}' component")));
            }
            c if c.len() > MAX_COMPONENT_BYTES => {
                return Err(invalid(format!(
                    "path component longer than {MAX_COMPONENT_BYTES} bytes"
                )));
            }
            _ => {}
        }
    }
    Ok(())
}

/// A list prefix: any leading part of a valid path (may end inside a component or with `/`);
/// empty means the whole workspace. Normalised to NFC like paths, so it matches their keys.
pub fn prefix(p: &str) -> Result<Cow<'_, str>> {
    let p = nfc(p);
    if p.len() > MAX_PATH_BYTES {
        return Err(invalid(format!(
            "prefix is longer than {MAX_PATH_BYTES} bytes"
        )));
    }
    if p.starts_with('/') {
        return Err(invalid("prefix must be relative (starts with '/')"));
    }
    check_chars(&p, "prefix")?;
    Ok(p)
}

/// A path glob (Find, Grep): NFC like paths, so its literal parts compare equal to the keys
/// they spell; relative, no control or format characters, non-empty. A glob ending in an
/// unescaped `/` names a directory and means everything under it (`src/` is `src/**`), as
/// `ls WS:src/` lists it. Its syntax is checked where it is compiled
/// ([`crate::glob::Glob::new`]).
pub fn glob(p: &str) -> Result<Cow<'_, str>> {
    let mut p = nfc(p);
    if p.is_empty() {
        return Err(invalid("glob is empty (use ** for every path)"));
    }
    if names_a_directory(&p) {
        p = Cow::Owned(format!("{p}**"));
    }
    if p.len() > crate::glob::MAX_GLOB_BYTES {
        return Err(invalid(format!(
            "glob is longer than {} bytes",
            crate::glob::MAX_GLOB_BYTES
        )));
    }
    if p.starts_with('/') {
        return Err(invalid("glob must be relative (starts with '/')"));
    }
    check_chars(&p, "glob")?;
    Ok(p)
}

/// Whether glob `g` ends in a `/` that separates segments: an odd run of `\` before it
/// escapes it (a literal `/` inside the last segment).
fn names_a_directory(g: &str) -> bool {
    g.strip_suffix('/')
        .is_some_and(|rest| rest.chars().rev().take_while(|&c| c == '\\').count() % 2 == 0)
}

/// `s` in Unicode Normalization Form C; borrowed when it already is (the common case, checked
/// without allocating).
fn nfc(s: &str) -> Cow<'_, str> {
    match is_nfc_quick(s.chars()) {
        IsNormalized::Yes => Cow::Borrowed(s),
        _ => Cow::Owned(s.nfc().collect()),
    }
}

/// A client-chosen request id: 1..=128 printable ASCII characters.
pub fn request_id(id: &str) -> Result<&str> {
    if id.is_empty() {
        return Err(invalid("request_id is required for mutations"));
    }
    if id.len() > MAX_REQUEST_ID_BYTES || !id.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(invalid(format!(
            "request_id must be 1..={MAX_REQUEST_ID_BYTES} printable ASCII characters"
        )));
    }
    Ok(id)
}

/// A publication receipt (BeginUpload): like a request id, 1..=128 printable ASCII characters.
pub fn receipt(id: &str) -> Result<&str> {
    if id.is_empty() || id.len() > MAX_REQUEST_ID_BYTES || !id.bytes().all(|b| b.is_ascii_graphic())
    {
        return Err(invalid(format!(
            "receipt must be 1..={MAX_REQUEST_ID_BYTES} printable ASCII characters"
        )));
    }
    Ok(id)
}

fn check_chars(p: &str, what: &str) -> Result<()> {
    if let Some(c) = p.chars().find(|c| c.is_control()) {
        return Err(invalid(format!(
            "{what} contains a control character (U+{:04X})",
            c as u32
        )));
    }
    if let Some(c) = p.chars().find(|&c| is_format_char(c)) {
        return Err(invalid(format!(
            "{what} contains an invisible format character (U+{:04X}); names that look alike \
             must be the same name",
            c as u32
        )));
    }
    Ok(())
}

/// Unicode general category Cf (format characters), Unicode 15.1, from
/// `extracted/DerivedGeneralCategory.txt` of the UCD (the `; Cf #` lines, 170 code points).
/// std exposes no general category, and a crate for one table of 21 ranges is not worth it.
const FORMAT_CHARS: &[(u32, u32)] = &[
    (0x00AD, 0x00AD),   // SOFT HYPHEN
    (0x0600, 0x0605),   // ARABIC NUMBER SIGN..ARABIC NUMBER MARK ABOVE
    (0x061C, 0x061C),   // ARABIC LETTER MARK
    (0x06DD, 0x06DD),   // ARABIC END OF AYAH
    (0x070F, 0x070F),   // SYRIAC ABBREVIATION MARK
    (0x0890, 0x0891),   // ARABIC POUND/PIASTRE MARK ABOVE
    (0x08E2, 0x08E2),   // ARABIC DISPUTED END OF AYAH
    (0x180E, 0x180E),   // MONGOLIAN VOWEL SEPARATOR
    (0x200B, 0x200F),   // ZERO WIDTH SPACE..RIGHT-TO-LEFT MARK
    (0x202A, 0x202E),   // LEFT-TO-RIGHT EMBEDDING..RIGHT-TO-LEFT OVERRIDE
    (0x2060, 0x2064),   // WORD JOINER..INVISIBLE PLUS
    (0x2066, 0x206F),   // LEFT-TO-RIGHT ISOLATE..NOMINAL DIGIT SHAPES
    (0xFEFF, 0xFEFF),   // ZERO WIDTH NO-BREAK SPACE (BOM)
    (0xFFF9, 0xFFFB),   // INTERLINEAR ANNOTATION ANCHOR..TERMINATOR
    (0x110BD, 0x110BD), // KAITHI NUMBER SIGN
    (0x110CD, 0x110CD), // KAITHI NUMBER SIGN ABOVE
    (0x13430, 0x1343F), // EGYPTIAN HIEROGLYPH VERTICAL JOINER..END WALLED ENCLOSURE
    (0x1BCA0, 0x1BCA3), // SHORTHAND FORMAT LETTER OVERLAP..UP STEP
    (0x1D173, 0x1D17A), // MUSICAL SYMBOL BEGIN BEAM..END PHRASE
    (0xE0001, 0xE0001), // LANGUAGE TAG
    (0xE0020, 0xE007F), // TAG SPACE..CANCEL TAG
];

fn is_format_char(c: char) -> bool {
    let c = c as u32;
    FORMAT_CHARS.iter().any(|&(lo, hi)| (lo..=hi).contains(&c))
}

fn invalid(msg: impl Into<String>) -> Error {
    Error::InvalidArgument(msg.into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_glob_ending_in_a_slash_means_everything_under_that_directory() {
        assert_eq!(glob("notes/").unwrap(), "notes/**");
        assert_eq!(glob("src/*/").unwrap(), "src/*/**");
        assert_eq!(glob("notes").unwrap(), "notes", "a path names itself only");
        assert_eq!(glob(r"a\/").unwrap(), r"a\/", "an escaped slash is literal");
        assert_eq!(
            glob(r"a\\/").unwrap(),
            r"a\\/**",
            "after an escaped backslash"
        );
        assert!(matches!(glob("/"), Err(Error::InvalidArgument(_))));
    }

    #[test]
    fn valid_names_pass_unchanged() {
        for ws in ["a", "0", "team-1", "a.b_c-d", &"a".repeat(63)] {
            assert_eq!(workspace(ws).unwrap(), ws);
        }
        for p in ["a", "a/b/c.txt", "ünïcode/файл", "x/.hidden", "a..b"] {
            assert_eq!(path(p).unwrap(), p);
        }
    }

    #[test]
    fn composed_and_decomposed_spellings_of_a_path_name_the_same_entry() {
        let composed = "caf\u{e9}/r\u{e9}sum\u{e9}.txt";
        let decomposed = "cafe\u{301}/re\u{301}sume\u{301}.txt";
        assert_eq!(path(decomposed).unwrap(), composed);
        assert_eq!(path(composed).unwrap(), composed);
        assert!(matches!(path(composed).unwrap(), Cow::Borrowed(_)));
        assert_eq!(prefix("cafe\u{301}/").unwrap(), "caf\u{e9}/");
        assert_eq!(glob("cafe\u{301}/*").unwrap(), "caf\u{e9}/*");
    }

    #[test]
    fn invisible_format_characters_are_refused_in_paths_and_prefixes() {
        let table_total: u32 = FORMAT_CHARS.iter().map(|(lo, hi)| hi - lo + 1).sum();
        assert_eq!(table_total, 170, "Unicode 15.1 has 170 Cf code points");
        for c in [
            '\u{ad}',
            '\u{200b}',
            '\u{200d}',
            '\u{202e}',
            '\u{2066}',
            '\u{feff}',
            '\u{e0041}',
        ] {
            let p = format!("a{c}b.txt");
            assert!(matches!(path(&p), Err(Error::InvalidArgument(_))), "{p:?}");
            assert!(
                matches!(prefix(&p), Err(Error::InvalidArgument(_))),
                "{p:?}"
            );
        }
    }

    #[test]
    fn every_bad_name_is_refused_as_invalid_argument() {
        let long_component = "a".repeat(256);
        let long_path = ["a"; 2049].join("/");
        for ws in ["", "A", "-a", ".a", "a b", "a/b", "ä", &"a".repeat(64)] {
            assert!(
                matches!(workspace(ws), Err(Error::InvalidArgument(_))),
                "{ws:?}"
            );
        }
        for p in [
            "",
            "/a",
            "a//b",
            "a/",
            ".",
            "..",
            "a/./b",
            "a/../b",
            "a\0b",
            "a\nb",
            "a\u{7f}",
            long_component.as_str(),
            long_path.as_str(),
        ] {
            assert!(matches!(path(p), Err(Error::InvalidArgument(_))), "{p:?}");
        }
        for id in ["", "a b", "é", &"x".repeat(129)] {
            assert!(
                matches!(request_id(id), Err(Error::InvalidArgument(_))),
                "{id:?}"
            );
        }
    }
}
