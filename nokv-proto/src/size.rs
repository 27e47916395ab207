//! The byte-size syntax both ends accept (`256MiB`, `1G`, `65536`): the server's size flags
//! and the CLI's quota argument parse with this one function, so a size the operator writes
//! for `nokv-server` means the same bytes when given to `nokv admin quota set`.

/// Parses a byte size: digits with an optional unit `B`, `K`/`KiB`, `M`/`MiB`, `G`/`GiB`,
/// `T`/`TiB` (binary multiples, case-insensitive, a space allowed before the unit). Decimal
/// units (`MB`) are refused rather than guessed at.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: u64 = num
        .parse()
        .map_err(|_| format!("{s:?} is not a size (e.g. 256MiB, 10GiB, 65536)"))?;
    let mult: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kib" => 1 << 10,
        "m" | "mib" => 1 << 20,
        "g" | "gib" => 1 << 30,
        "t" | "tib" => 1 << 40,
        other => {
            return Err(format!(
                "{s:?}: unknown size unit {other:?} (use KiB, MiB, GiB, TiB)"
            ));
        }
    };
    n.checked_mul(mult)
        .ok_or_else(|| format!("{s:?} is too large"))
}

#[cfg(test)]
mod tests {
    use super::parse_size;

    const MIB: u64 = 1024 * 1024;

    #[test]
    fn sizes_take_binary_units_in_any_case_and_refuse_everything_else() {
        assert_eq!(parse_size("256MiB").unwrap(), 256 * MIB);
        assert_eq!(parse_size("1g").unwrap(), 1024 * MIB);
        assert_eq!(parse_size("64 K").unwrap(), 64 * 1024);
        assert_eq!(parse_size("2TiB").unwrap(), 2 << 40);
        assert_eq!(parse_size("65536").unwrap(), 65536);
        assert!(parse_size("").is_err());
        assert!(parse_size("10MB").is_err());
        assert!(parse_size("12 furlongs").is_err());
        assert!(parse_size("-1M").is_err());
        assert!(parse_size("99999999999T").is_err());
    }
}
