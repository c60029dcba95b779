//! URIs as chorus reads them: percent-decoding and `file://` paths.

use std::path::PathBuf;

/// `text` with its `%XX` escapes decoded; a `%` not followed by two hex
/// digits is kept as it is.
pub fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut index = 0;
    while index < bytes.len() {
        let hex = bytes.get(index + 1..index + 3).and_then(|hex| std::str::from_utf8(hex).ok());
        match (bytes[index], hex.and_then(|hex| u8::from_str_radix(hex, 16).ok())) {
            (b'%', Some(byte)) => {
                out.push(byte);
                index += 3;
            }
            (byte, _) => {
                out.push(byte);
                index += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The path of a `file://` URI (`file:///a/b`, `file://localhost/a/b`),
/// percent-decoded; `None` for another scheme or a relative path.
pub fn file_path(uri: &str) -> Option<PathBuf> {
    let path = uri.strip_prefix("file://")?;
    let path = path.strip_prefix("localhost").unwrap_or(path);
    path.starts_with('/').then(|| PathBuf::from(percent_decode(path)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_absolute_file_uris_have_a_path() {
        assert_eq!(file_path("file:///a/b"), Some(PathBuf::from("/a/b")));
        assert_eq!(file_path("file://localhost/a"), Some(PathBuf::from("/a")));
        assert_eq!(file_path("file:///with%20space.txt"), Some(PathBuf::from("/with space.txt")));
        assert_eq!(file_path("https://example.com/a"), None);
        assert_eq!(file_path("file://relative"), None);
    }

    #[test]
    fn a_percent_without_two_hex_digits_is_kept() {
        assert_eq!(percent_decode("100%25 %zz %4"), "100% %zz %4");
    }
}
