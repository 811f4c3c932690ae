//! How a load run writes numbers for people: grouped integers, rates, durations. Shared by the
//! live monitor and the reports (so neither imports the other, and the report module does not
//! loop back through the driver).

/// `1234567` → `1,234,567`.
pub fn group(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// A rate as a grouped integer (`2,130,455`).
pub fn rate(per_s: f64) -> String {
    if per_s.is_finite() && per_s >= 0.0 {
        group(per_s.round() as u64)
    } else {
        "n/a".into()
    }
}

/// Microseconds in the most readable unit: `850 ns`, `12.3 µs`, `1.25 ms`, `2.10 s`.
pub fn duration_us(us: f64) -> String {
    if us < 1.0 {
        format!("{:.0} ns", us * 1000.0)
    } else if us < 1000.0 {
        format!("{us:.1} µs")
    } else if us < 1_000_000.0 {
        format!("{:.2} ms", us / 1000.0)
    } else {
        format!("{:.2} s", us / 1_000_000.0)
    }
}
