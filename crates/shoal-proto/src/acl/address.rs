//! Remote address patterns of `plain_acl.yml` (RocketMQ's `RemoteAddressStrategy`): `*` (any),
//! an exact address, a trailing wildcard (`192.168.*`, `192.168.1.*`), a range or list in the
//! last given part (`192.168.1.10-20`, `192.168.1.{1,2,3}`), several patterns separated by
//! commas; and, as a Shoal extension, CIDR blocks (`10.0.0.0/8`, `fd00::/8`).

use std::net::IpAddr;

/// A pattern that cannot be parsed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid remote address pattern {0:?}: {1}")]
pub struct AddressPatternError(pub String, pub &'static str);

#[derive(Debug, Clone, PartialEq, Eq)]
enum Part {
    Any,
    Range(u8, u8),
    List(Vec<u8>),
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Pattern {
    Any,
    Exact(IpAddr),
    Cidr(IpAddr, u8),
    /// IPv4 parts; missing trailing parts are wildcards.
    V4(Vec<Part>),
}

/// A compiled address pattern (one or more alternatives).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AddressPattern {
    alternatives: Vec<Pattern>,
    text: String,
}

fn parse_part(p: &str, text: &str) -> Result<Part, AddressPatternError> {
    let bad = |why| AddressPatternError(text.to_string(), why);
    let num = |s: &str| {
        s.trim()
            .parse::<u8>()
            .map_err(|_| bad("a part is not 0..=255"))
    };
    if p == "*" {
        return Ok(Part::Any);
    }
    if let Some(inner) = p.strip_prefix('{').and_then(|r| r.strip_suffix('}')) {
        let list = inner.split(',').map(num).collect::<Result<Vec<_>, _>>()?;
        return Ok(Part::List(list));
    }
    if let Some((a, b)) = p.split_once('-') {
        let (a, b) = (num(a)?, num(b)?);
        if a > b {
            return Err(bad("range start above its end"));
        }
        return Ok(Part::Range(a, b));
    }
    let n = num(p)?;
    Ok(Part::Range(n, n))
}

fn parse_one(text: &str) -> Result<Pattern, AddressPatternError> {
    let t = text.trim();
    let bad = |why| AddressPatternError(text.to_string(), why);
    if t == "*" || t == "*.*.*.*" {
        return Ok(Pattern::Any);
    }
    if let Some((ip, bits)) = t.split_once('/') {
        let ip: IpAddr = ip
            .parse()
            .map_err(|_| bad("not an IP address before '/'"))?;
        let bits: u8 = bits.parse().map_err(|_| bad("bad prefix length"))?;
        let max = if ip.is_ipv4() { 32 } else { 128 };
        if bits > max {
            return Err(bad("prefix length too long"));
        }
        return Ok(Pattern::Cidr(ip, bits));
    }
    if let Ok(ip) = t.parse::<IpAddr>() {
        return Ok(Pattern::Exact(ip));
    }
    if t.contains(':') {
        return Err(bad("IPv6 patterns must be exact addresses or CIDR blocks"));
    }
    // `{a,b}` contains commas: split parts on '.' only.
    let parts: Vec<&str> = t.split('.').collect();
    if parts.is_empty() || parts.len() > 4 {
        return Err(bad("an IPv4 pattern has at most 4 parts"));
    }
    let compiled = parts
        .iter()
        .map(|p| parse_part(p, text))
        .collect::<Result<Vec<_>, _>>()?;
    if compiled.len() < 4 && !matches!(compiled.last(), Some(Part::Any)) {
        return Err(bad("a short IPv4 pattern must end with *"));
    }
    Ok(Pattern::V4(compiled))
}

/// Splits on commas outside braces.
fn split_alternatives(text: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let (mut depth, mut start) = (0, 0);
    for (i, c) in text.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                out.push(&text[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push(&text[start..]);
    out.into_iter().filter(|s| !s.trim().is_empty()).collect()
}

impl AddressPattern {
    /// Parses a pattern.
    pub fn parse(text: &str) -> Result<Self, AddressPatternError> {
        let alternatives = split_alternatives(text)
            .into_iter()
            .map(parse_one)
            .collect::<Result<Vec<_>, _>>()?;
        if alternatives.is_empty() {
            return Err(AddressPatternError(text.to_string(), "empty"));
        }
        Ok(Self {
            alternatives,
            text: text.to_string(),
        })
    }

    /// The pattern as written.
    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// Whether `ip` matches.
    pub fn matches(&self, ip: IpAddr) -> bool {
        let ip = match ip {
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
            v4 => v4,
        };
        self.alternatives.iter().any(|p| match p {
            Pattern::Any => true,
            Pattern::Exact(e) => *e == ip,
            Pattern::Cidr(net, bits) => in_cidr(ip, *net, *bits),
            Pattern::V4(parts) => match ip {
                IpAddr::V4(v4) => {
                    let octets = v4.octets();
                    parts.iter().enumerate().all(|(i, part)| match part {
                        Part::Any => true,
                        Part::Range(a, b) => (*a..=*b).contains(&octets[i]),
                        Part::List(l) => l.contains(&octets[i]),
                    })
                }
                IpAddr::V6(_) => false,
            },
        })
    }
}

fn in_cidr(ip: IpAddr, net: IpAddr, bits: u8) -> bool {
    match (ip, net) {
        (IpAddr::V4(a), IpAddr::V4(n)) => {
            let mask = if bits == 0 {
                0
            } else {
                u32::MAX << (32 - bits)
            };
            u32::from(a) & mask == u32::from(n) & mask
        }
        (IpAddr::V6(a), IpAddr::V6(n)) => {
            let mask = if bits == 0 {
                0
            } else {
                u128::MAX << (128 - bits)
            };
            u128::from(a) & mask == u128::from(n) & mask
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(p: &str, ip: &str) -> bool {
        AddressPattern::parse(p)
            .unwrap()
            .matches(ip.parse().unwrap())
    }

    #[test]
    fn rocketmq_patterns_and_cidr() {
        assert!(m("*", "8.8.8.8"));
        assert!(m("*.*.*.*", "::1"));
        assert!(m("192.168.0.1", "192.168.0.1"));
        assert!(!m("192.168.0.1", "192.168.0.2"));
        assert!(m("192.168.*", "192.168.7.9"));
        assert!(!m("192.168.*", "192.169.7.9"));
        assert!(m("192.168.1.10-20", "192.168.1.15"));
        assert!(!m("192.168.1.10-20", "192.168.1.21"));
        assert!(m("192.168.1.{1,2,3}", "192.168.1.2"));
        assert!(!m("192.168.1.{1,2,3}", "192.168.1.4"));
        assert!(m("10.0.0.0/8, 127.0.0.1", "127.0.0.1"));
        assert!(m("10.0.0.0/8", "10.200.3.4"));
        assert!(m("127.0.0.1", "::ffff:127.0.0.1"));
        assert!(m("fd00::/8", "fd12::1"));
        assert!(AddressPattern::parse("192.168").is_err());
        assert!(AddressPattern::parse("300.1.1.1").is_err());
        assert!(AddressPattern::parse("1.1.1.9-2").is_err());
        assert!(AddressPattern::parse("").is_err());
    }
}
