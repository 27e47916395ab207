//! The receipt `nokv_publish` derives from its call when the model gives none.
//!
//! A host retries a tool call that failed (the process died, the transport dropped) by making
//! the same call again; nothing else identifies "the same publication". So the receipt is a
//! digest of what the call names — workspace, destination path, the local path (absolute,
//! under the canonical `--local-root`) — and of the local file's size and modification time: the same arguments on an unchanged file
//! give the same receipt, and the SDK resumes the open upload (or answers the committed entry)
//! instead of uploading again. A file modified since gets a new receipt and a new upload,
//! rather than being refused as another file under the old receipt. The server still checks
//! the whole-file sha256 under the receipt, so an mtime that did not move cannot publish
//! different bytes under an old receipt.

use std::fs::Metadata;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use sha2::{Digest, Sha256};

/// Marks derived receipts apart from ones a model or a CLI user chose.
const PREFIX: &str = "mcp-";

/// The receipt of publishing the file `local`, whose metadata is `meta` (taken from the open
/// file), as `workspace:path` (68 printable ASCII characters).
pub fn derive(workspace: &str, path: &str, local: &Path, meta: &Metadata) -> String {
    let mut h = Sha256::new();
    // Each field is length-prefixed, so no two different calls hash the same byte string.
    for field in [
        workspace.as_bytes(),
        path.as_bytes(),
        local.as_os_str().as_encoded_bytes(),
    ] {
        h.update((field.len() as u64).to_le_bytes());
        h.update(field);
    }
    h.update(meta.len().to_le_bytes());
    h.update(meta.mtime().to_le_bytes());
    h.update(meta.mtime_nsec().to_le_bytes());
    format!("{PREFIX}{}", hex::encode(h.finalize()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn derive_now(workspace: &str, path: &str, local: &Path) -> String {
        derive(workspace, path, local, &std::fs::metadata(local).unwrap())
    }

    #[test]
    fn the_same_call_on_an_unchanged_file_derives_the_same_receipt_and_a_changed_one_does_not() {
        let dir = std::env::temp_dir().join(format!("nokv-mcp-receipt-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("data.bin");
        std::fs::write(&file, b"one").unwrap();
        let first = derive_now("ws", "a.bin", &file);
        assert_eq!(first, derive_now("ws", "a.bin", &file));
        assert!(first.len() <= 128 && first.bytes().all(|b| b.is_ascii_graphic()));
        assert_ne!(first, derive_now("ws", "b.bin", &file));
        assert_ne!(first, derive_now("ws2", "a.bin", &file));
        // Same size, new content: only the modification time tells them apart.
        std::fs::write(&file, b"two").unwrap();
        let later = std::time::SystemTime::now() + std::time::Duration::from_secs(10);
        let f = std::fs::File::options().write(true).open(&file).unwrap();
        f.set_modified(later).unwrap();
        assert_ne!(first, derive_now("ws", "a.bin", &file));
        std::fs::write(&file, b"three").unwrap();
        f.set_modified(later).unwrap();
        assert_ne!(first, derive_now("ws", "a.bin", &file));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
