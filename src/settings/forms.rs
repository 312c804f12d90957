//! How settings values read and print: addresses with an error that shows their shape,
//! and the empty string that still means "off" for optional values and files.

use std::{
    fmt::Display,
    net::SocketAddr,
    path::{Path, PathBuf},
    str::FromStr,
};

use serde::{Deserialize, Deserializer, Serializer};

/// A socket address, with an error that shows the expected shape.
pub(super) mod address {
    use super::*;

    pub fn serialize<S: Serializer>(value: &SocketAddr, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(value)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<SocketAddr, D::Error> {
        let raw = String::deserialize(deserializer)?;
        parse_address(&raw).map_err(serde::de::Error::custom)
    }
}

fn parse_address(raw: &str) -> Result<SocketAddr, String> {
    raw.parse()
        .map_err(|e| format!("{raw:?} is not an address like 127.0.0.1:50051 ({e})"))
}

/// An optional socket address: "" = off.
pub(super) mod optional_address {
    use super::*;

    pub fn serialize<S: Serializer>(
        value: &Option<SocketAddr>,
        serializer: S,
    ) -> Result<S::Ok, S::Error> {
        empty_string_is_none::serialize(value, serializer)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(
        deserializer: D,
    ) -> Result<Option<SocketAddr>, D::Error> {
        let raw = String::deserialize(deserializer)?;
        if raw.is_empty() {
            return Ok(None);
        }
        parse_address(&raw)
            .map(Some)
            .map_err(serde::de::Error::custom)
    }
}

/// An optional value written as a string: "" = not set.
pub(super) mod empty_string_is_none {
    use super::*;

    pub fn serialize<S: Serializer, T: Display>(
        value: &Option<T>,
        serializer: S,
    ) -> Result<S::Ok, S::Error> {
        match value {
            Some(value) => serializer.collect_str(value),
            None => serializer.serialize_str(""),
        }
    }

    pub fn deserialize<'de, D, T>(deserializer: D) -> Result<Option<T>, D::Error>
    where
        D: Deserializer<'de>,
        T: FromStr,
        T::Err: Display,
    {
        let raw = String::deserialize(deserializer)?;
        if raw.is_empty() {
            return Ok(None);
        }
        raw.parse().map(Some).map_err(serde::de::Error::custom)
    }
}

/// An optional path: "" = not set.
pub(super) mod empty_path_is_none {
    use super::*;

    pub fn serialize<S: Serializer>(
        value: &Option<PathBuf>,
        serializer: S,
    ) -> Result<S::Ok, S::Error> {
        let shown = value.as_deref().map(Path::display);
        empty_string_is_none::serialize(&shown, serializer)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(
        deserializer: D,
    ) -> Result<Option<PathBuf>, D::Error> {
        let raw = String::deserialize(deserializer)?;
        Ok((!raw.is_empty()).then(|| PathBuf::from(raw)))
    }
}
