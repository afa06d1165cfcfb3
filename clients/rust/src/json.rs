//! A small, strict JSON value (RFC 8259) with its parser and compact
//! serializer — what the daemon's JSON-RPC lines need, without a crate.
//!
//! Strict: one value and nothing after it but whitespace; no trailing
//! commas, comments, single quotes, leading zeros, `NaN`/`Infinity`, or
//! unescaped control characters; every `\u` escape checked (a lone
//! surrogate is refused); duplicate object keys refused; nesting bounded
//! by [`MAX_DEPTH`]. Errors say what was wrong and at which byte.

use std::fmt;

/// Deepest nesting [`parse`] accepts.
pub const MAX_DEPTH: usize = 512;

/// A JSON value. Objects keep their keys in order (and have no duplicates
/// when parsed); integers that fit an `i64` stay exact.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    Null,
    Bool(bool),
    Int(i64),
    Float(f64),
    Str(String),
    Array(Vec<Value>),
    Object(Vec<(String, Value)>),
}

/// Why a text is not JSON: a reason and the byte offset where it was found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParseError {
    pub offset: usize,
    pub reason: String,
}

impl fmt::Display for ParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "invalid JSON at byte {}: {}", self.offset, self.reason)
    }
}

impl std::error::Error for ParseError {}

impl Value {
    /// The member `key` of an object; `None` for another value or a key it lacks.
    pub fn get(&self, key: &str) -> Option<&Value> {
        match self {
            Value::Object(m) => m.iter().find(|(k, _)| k == key).map(|(_, v)| v),
            _ => None,
        }
    }
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::Str(s) => Some(s),
            _ => None,
        }
    }
    pub fn as_i64(&self) -> Option<i64> {
        match self {
            Value::Int(i) => Some(*i),
            _ => None,
        }
    }
    pub fn as_f64(&self) -> Option<f64> {
        match self {
            Value::Int(i) => Some(*i as f64),
            Value::Float(f) => Some(*f),
            _ => None,
        }
    }
    pub fn as_bool(&self) -> Option<bool> {
        match self {
            Value::Bool(b) => Some(*b),
            _ => None,
        }
    }
    pub fn as_array(&self) -> Option<&Vec<Value>> {
        match self {
            Value::Array(a) => Some(a),
            _ => None,
        }
    }
    pub fn as_object(&self) -> Option<&Vec<(String, Value)>> {
        match self {
            Value::Object(m) => Some(m),
            _ => None,
        }
    }
    pub fn is_null(&self) -> bool {
        matches!(self, Value::Null)
    }
    /// Sets `key` of an object (replacing its value); does nothing to another value.
    pub fn set(&mut self, key: &str, v: Value) {
        if let Value::Object(m) = self {
            match m.iter_mut().find(|(k, _)| k == key) {
                Some(slot) => slot.1 = v,
                None => m.push((key.to_string(), v)),
            }
        }
    }
    /// An empty object.
    pub fn object() -> Value {
        Value::Object(Vec::new())
    }
    /// The compact text of the value. A float that is not finite (JSON has
    /// none) is written as `null`.
    pub fn to_json(&self) -> String {
        let mut out = String::new();
        write_value(self, &mut out);
        out
    }
}

impl From<&str> for Value {
    fn from(s: &str) -> Value {
        Value::Str(s.to_string())
    }
}
impl From<String> for Value {
    fn from(s: String) -> Value {
        Value::Str(s)
    }
}
impl From<bool> for Value {
    fn from(b: bool) -> Value {
        Value::Bool(b)
    }
}
impl From<i64> for Value {
    fn from(i: i64) -> Value {
        Value::Int(i)
    }
}
impl From<f64> for Value {
    fn from(f: f64) -> Value {
        Value::Float(f)
    }
}

fn write_str(s: &str, out: &mut String) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            // U+2028/2029 are valid JSON but break JavaScript readers of a line
            c if (c as u32) < 0x20 || c == '\u{2028}' || c == '\u{2029}' => {
                out.push_str(&format!("\\u{:04x}", c as u32))
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

fn write_value(v: &Value, out: &mut String) {
    match v {
        Value::Null => out.push_str("null"),
        Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Value::Int(i) => out.push_str(&i.to_string()),
        Value::Float(f) => {
            if !f.is_finite() {
                out.push_str("null")
            } else if f.fract() == 0.0 && f.abs() < 1e15 {
                out.push_str(&format!("{:.1}", f))
            } else {
                // Rust's shortest round-trip form; it may use an exponent (1e300)
                out.push_str(&format!("{:?}", f))
            }
        }
        Value::Str(s) => write_str(s, out),
        Value::Array(a) => {
            out.push('[');
            for (i, x) in a.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_value(x, out);
            }
            out.push(']');
        }
        Value::Object(m) => {
            out.push('{');
            for (i, (k, x)) in m.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_str(k, out);
                out.push(':');
                write_value(x, out);
            }
            out.push('}');
        }
    }
}

/// Parses `text` as exactly one JSON value.
pub fn parse(text: &str) -> Result<Value, ParseError> {
    let mut p = Parser {
        b: text.as_bytes(),
        i: 0,
    };
    p.ws();
    let v = p.value(0)?;
    p.ws();
    if p.i != p.b.len() {
        return Err(p.err("unexpected text after the value"));
    }
    Ok(v)
}

struct Parser<'a> {
    b: &'a [u8],
    i: usize,
}

impl<'a> Parser<'a> {
    fn err(&self, reason: &str) -> ParseError {
        ParseError {
            offset: self.i,
            reason: reason.to_string(),
        }
    }
    fn ws(&mut self) {
        while self.i < self.b.len() && matches!(self.b[self.i], b' ' | b'\t' | b'\n' | b'\r') {
            self.i += 1;
        }
    }
    fn peek(&self) -> Option<u8> {
        self.b.get(self.i).copied()
    }
    fn lit(&mut self, word: &str, v: Value) -> Result<Value, ParseError> {
        if self.b[self.i..].starts_with(word.as_bytes()) {
            self.i += word.len();
            Ok(v)
        } else {
            Err(self.err("unknown literal"))
        }
    }
    fn value(&mut self, depth: usize) -> Result<Value, ParseError> {
        if depth >= MAX_DEPTH {
            return Err(self.err(&format!("nested deeper than {} levels", MAX_DEPTH)));
        }
        match self.peek() {
            None => Err(self.err("unexpected end of text")),
            Some(b'n') => self.lit("null", Value::Null),
            Some(b't') => self.lit("true", Value::Bool(true)),
            Some(b'f') => self.lit("false", Value::Bool(false)),
            Some(b'"') => Ok(Value::Str(self.string()?)),
            Some(b'[') => {
                self.i += 1;
                let mut a = Vec::new();
                self.ws();
                if self.peek() == Some(b']') {
                    self.i += 1;
                    return Ok(Value::Array(a));
                }
                loop {
                    self.ws();
                    a.push(self.value(depth + 1)?);
                    self.ws();
                    match self.peek() {
                        Some(b',') => self.i += 1,
                        Some(b']') => {
                            self.i += 1;
                            return Ok(Value::Array(a));
                        }
                        _ => return Err(self.err("expected ',' or ']' in an array")),
                    }
                }
            }
            Some(b'{') => {
                self.i += 1;
                let mut m: Vec<(String, Value)> = Vec::new();
                self.ws();
                if self.peek() == Some(b'}') {
                    self.i += 1;
                    return Ok(Value::Object(m));
                }
                loop {
                    self.ws();
                    if self.peek() != Some(b'"') {
                        return Err(self.err("expected a string key in an object"));
                    }
                    let at = self.i;
                    let k = self.string()?;
                    if m.iter().any(|(x, _)| *x == k) {
                        return Err(ParseError {
                            offset: at,
                            reason: format!("duplicate key \"{}\"", k),
                        });
                    }
                    self.ws();
                    if self.peek() != Some(b':') {
                        return Err(self.err("expected ':' after an object key"));
                    }
                    self.i += 1;
                    self.ws();
                    let v = self.value(depth + 1)?;
                    m.push((k, v));
                    self.ws();
                    match self.peek() {
                        Some(b',') => self.i += 1,
                        Some(b'}') => {
                            self.i += 1;
                            return Ok(Value::Object(m));
                        }
                        _ => return Err(self.err("expected ',' or '}' in an object")),
                    }
                }
            }
            Some(c) if c == b'-' || c.is_ascii_digit() => self.number(),
            Some(_) => Err(self.err("unexpected character")),
        }
    }
    fn digits(&mut self) -> usize {
        let s = self.i;
        while self.peek().map_or(false, |c| c.is_ascii_digit()) {
            self.i += 1;
        }
        self.i - s
    }
    fn number(&mut self) -> Result<Value, ParseError> {
        let start = self.i;
        if self.peek() == Some(b'-') {
            self.i += 1;
        }
        let int_start = self.i;
        let n = self.digits();
        if n == 0 {
            return Err(self.err("expected a digit"));
        }
        if n > 1 && self.b[int_start] == b'0' {
            return Err(ParseError {
                offset: int_start,
                reason: "leading zero".to_string(),
            });
        }
        let mut float = false;
        if self.peek() == Some(b'.') {
            self.i += 1;
            float = true;
            if self.digits() == 0 {
                return Err(self.err("expected a digit after '.'"));
            }
        }
        if matches!(self.peek(), Some(b'e') | Some(b'E')) {
            self.i += 1;
            float = true;
            if matches!(self.peek(), Some(b'+') | Some(b'-')) {
                self.i += 1;
            }
            if self.digits() == 0 {
                return Err(self.err("expected a digit in the exponent"));
            }
        }
        // the grammar was checked above: the text is ASCII
        let text = std::str::from_utf8(&self.b[start..self.i]).unwrap_or("");
        if !float {
            if let Ok(i) = text.parse::<i64>() {
                return Ok(Value::Int(i));
            }
        }
        match text.parse::<f64>() {
            Ok(f) if f.is_finite() => Ok(Value::Float(f)),
            _ => Err(ParseError {
                offset: start,
                reason: "number out of range".to_string(),
            }),
        }
    }
    fn hex4(&mut self) -> Result<u32, ParseError> {
        if self.i + 4 > self.b.len() {
            return Err(self.err("truncated \\u escape"));
        }
        let mut v = 0u32;
        for k in 0..4 {
            let c = self.b[self.i + k];
            let d = (c as char)
                .to_digit(16)
                .ok_or_else(|| self.err("bad hex digit in \\u escape"))?;
            v = v * 16 + d;
        }
        self.i += 4;
        Ok(v)
    }
    fn string(&mut self) -> Result<String, ParseError> {
        self.i += 1; // the opening quote
        let mut out = String::new();
        loop {
            let start = self.i;
            while self.i < self.b.len() && self.b[self.i] != b'"' && self.b[self.i] != b'\\' {
                if self.b[self.i] < 0x20 {
                    return Err(self.err("unescaped control character in a string"));
                }
                self.i += 1;
            }
            // the input is a &str, and '"' and '\\' are never inside a UTF-8 sequence
            out.push_str(std::str::from_utf8(&self.b[start..self.i]).unwrap_or(""));
            match self.peek() {
                None => return Err(self.err("unterminated string")),
                Some(b'"') => {
                    self.i += 1;
                    return Ok(out);
                }
                _ => {}
            }
            self.i += 1; // the backslash
            let c = self.peek().ok_or_else(|| self.err("unterminated escape"))?;
            self.i += 1;
            match c {
                b'"' => out.push('"'),
                b'\\' => out.push('\\'),
                b'/' => out.push('/'),
                b'b' => out.push('\u{8}'),
                b'f' => out.push('\u{c}'),
                b'n' => out.push('\n'),
                b'r' => out.push('\r'),
                b't' => out.push('\t'),
                b'u' => {
                    let hi = self.hex4()?;
                    let cp = if (0xD800..0xDC00).contains(&hi) {
                        if !self.b[self.i..].starts_with(b"\\u") {
                            return Err(self.err("high surrogate without its low half"));
                        }
                        self.i += 2;
                        let lo = self.hex4()?;
                        if !(0xDC00..0xE000).contains(&lo) {
                            return Err(self.err("high surrogate without its low half"));
                        }
                        0x10000 + ((hi - 0xD800) << 10) + (lo - 0xDC00)
                    } else if (0xDC00..0xE000).contains(&hi) {
                        return Err(self.err("lone low surrogate"));
                    } else {
                        hi
                    };
                    out.push(char::from_u32(cp).ok_or_else(|| self.err("invalid code point"))?);
                }
                _ => return Err(self.err("unknown escape")),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_values() {
        let v =
            parse(r#" {"a": [1, -2, 3.5, 1e3, true, false, null], "b": "x\n\u00e9\ud83d\ude00"} "#)
                .unwrap();
        let a = v.get("a").unwrap().as_array().unwrap();
        assert_eq!(a[0], Value::Int(1));
        assert_eq!(a[1], Value::Int(-2));
        assert_eq!(a[2], Value::Float(3.5));
        assert_eq!(a[3], Value::Float(1000.0));
        assert_eq!(a[4], Value::Bool(true));
        assert!(a[6].is_null());
        assert_eq!(v.get("b").unwrap().as_str().unwrap(), "x\né😀");
        assert_eq!(parse("0").unwrap(), Value::Int(0));
        assert_eq!(parse("-0.0").unwrap(), Value::Float(-0.0));
        assert_eq!(parse("9223372036854775807").unwrap(), Value::Int(i64::MAX));
        assert_eq!(
            parse("9223372036854775808").unwrap(),
            Value::Float(9223372036854775808.0)
        );
        assert_eq!(parse("\"\\u0000\"").unwrap(), Value::Str("\0".to_string()));
        assert_eq!(parse("[]").unwrap(), Value::Array(vec![]));
        assert_eq!(parse("{}").unwrap(), Value::object());
    }

    #[test]
    fn refuses_what_is_not_json() {
        let bad = [
            "",
            " ",
            "[1,]",
            "{\"a\":1,}",
            "01",
            "-",
            "1.",
            ".5",
            "1e",
            "+1",
            "NaN",
            "Infinity",
            "[1 2]",
            "{\"a\" 1}",
            "{a:1}",
            "'x'",
            "\"abc",
            "\"\\x\"",
            "\"\\u12\"",
            "\"\\ud800\"",
            "\"\\udc00\"",
            "\"\\ud800\\u0041\"",
            "\"a\tb\"",
            "tru",
            "nul",
            "[1]x",
            "{\"a\":1}}",
            "1e400",
            "/* c */1",
            "{\"a\":1,\"a\":2}",
            "[",
            "{",
        ];
        for b in bad.iter() {
            assert!(parse(b).is_err(), "accepted {:?}", b);
        }
        let e = parse("{\"a\":1,\"a\":2}").unwrap_err();
        assert!(e.reason.contains("duplicate key \"a\""), "{}", e);
        assert_eq!(e.offset, 7);
        assert_eq!(parse("[1,]").unwrap_err().offset, 3);
    }

    #[test]
    fn depth_is_bounded() {
        let deep = "[".repeat(MAX_DEPTH + 1) + &"]".repeat(MAX_DEPTH + 1);
        assert!(parse(&deep).unwrap_err().reason.contains("nested deeper"));
        let ok = "[".repeat(MAX_DEPTH - 1) + &"]".repeat(MAX_DEPTH - 1);
        assert!(parse(&ok).is_ok());
    }

    #[test]
    fn serializes_and_round_trips() {
        let mut o = Value::object();
        o.set("s", Value::from("q\"\\\n\t\u{1}\u{2028}é"));
        o.set("i", Value::from(-5i64));
        o.set("f", Value::from(0.1f64));
        o.set("w", Value::from(2.0f64));
        o.set("n", Value::Null);
        o.set("a", Value::Array(vec![Value::Bool(true), Value::object()]));
        o.set("i", Value::from(7i64)); // replaces, keeps the place
        let text = o.to_json();
        assert_eq!(
            text,
            r#"{"s":"q\"\\\n\t\u0001\u2028é","i":7,"f":0.1,"w":2.0,"n":null,"a":[true,{}]}"#
        );
        assert_eq!(parse(&text).unwrap(), o);
        assert_eq!(Value::Float(f64::NAN).to_json(), "null");
        for f in [1e300, -2.5e-300, 123456789.125, 1e15, 3.0e16] {
            assert_eq!(parse(&Value::Float(f).to_json()).unwrap().as_f64(), Some(f));
        }
    }
}
