//! JSON-RPC 1.0 messages as OVSDB uses them (RFC 7047 §4).
//!
//! Pure: conversion between [`Message`] and `serde_json::Value`/bytes.

use serde_json::{Map, Value, json};

use crate::Error;

/// One JSON-RPC message.
#[derive(Debug, Clone, PartialEq)]
pub enum Message {
    /// A call that expects a response with the same `id`.
    Request {
        /// Correlates the response; OVSDB servers use strings ("echo") or
        /// numbers.
        id: Value,
        /// Method name, e.g. `transact`, `echo`.
        method: String,
        /// Positional parameters (a JSON array).
        params: Value,
    },
    /// A call without a response (`"id": null`), e.g. `update`.
    Notification {
        /// Method name, e.g. `update`, `update2`.
        method: String,
        /// Positional parameters (a JSON array).
        params: Value,
    },
    /// The answer to a request.
    Response {
        /// The request's `id`.
        id: Value,
        /// The result; `null` when `error` is set.
        result: Value,
        /// `null` on success, otherwise the server's error value.
        error: Value,
    },
}

impl Message {
    /// Classifies a decoded JSON value; anything that is not one of the three
    /// shapes is [`Error::Malformed`].
    pub fn from_value(value: Value) -> Result<Self, Error> {
        let Value::Object(mut obj) = value else {
            return Err(malformed("JSON-RPC message is not an object"));
        };
        let id = obj.remove("id").unwrap_or(Value::Null);
        match obj.remove("method") {
            Some(Value::String(method)) => {
                let params = obj.remove("params").unwrap_or(Value::Array(Vec::new()));
                if !params.is_array() {
                    return Err(malformed("JSON-RPC params is not an array"));
                }
                if id.is_null() {
                    Ok(Message::Notification { method, params })
                } else {
                    Ok(Message::Request { id, method, params })
                }
            }
            Some(_) => Err(malformed("JSON-RPC method is not a string")),
            None => {
                if !obj.contains_key("result") && !obj.contains_key("error") {
                    return Err(malformed("JSON-RPC message has neither method nor result"));
                }
                let result = obj.remove("result").unwrap_or(Value::Null);
                let error = obj.remove("error").unwrap_or(Value::Null);
                Ok(Message::Response { id, result, error })
            }
        }
    }

    /// The JSON form, as sent on the wire.
    pub fn to_value(&self) -> Value {
        match self {
            Message::Request { id, method, params } => {
                json!({"id": id, "method": method, "params": params})
            }
            Message::Notification { method, params } => {
                json!({"id": null, "method": method, "params": params})
            }
            Message::Response { id, result, error } => {
                let mut m = Map::new();
                m.insert("id".into(), id.clone());
                m.insert("result".into(), result.clone());
                m.insert("error".into(), error.clone());
                Value::Object(m)
            }
        }
    }

    /// Serializes into `out` (appending), avoiding an intermediate `Value`
    /// for the hot request path.
    pub fn write_to(&self, out: &mut Vec<u8>) -> Result<(), Error> {
        #[derive(serde::Serialize)]
        struct Wire<'a> {
            id: &'a Value,
            #[serde(skip_serializing_if = "Option::is_none")]
            method: Option<&'a str>,
            #[serde(skip_serializing_if = "Option::is_none")]
            params: Option<&'a Value>,
            #[serde(skip_serializing_if = "Option::is_none")]
            result: Option<&'a Value>,
            #[serde(skip_serializing_if = "Option::is_none")]
            error: Option<&'a Value>,
        }
        const NULL: Value = Value::Null;
        // Borrowing, so a request's params are never cloned on the way out.
        let wire = match self {
            Message::Request { id, method, params } => Wire {
                id,
                method: Some(method),
                params: Some(params),
                result: None,
                error: None,
            },
            Message::Notification { method, params } => Wire {
                id: &NULL,
                method: Some(method),
                params: Some(params),
                result: None,
                error: None,
            },
            Message::Response { id, result, error } => Wire {
                id,
                method: None,
                params: None,
                result: Some(result),
                error: Some(error),
            },
        };
        serde_json::to_writer(&mut *out, &wire)
            .map_err(|e| malformed(&format!("cannot serialize JSON-RPC message: {e}")))
    }

    /// The reply to a server's `echo` request: the same params, same id.
    pub fn echo_reply(id: Value, params: Value) -> Self {
        Message::Response {
            id,
            result: params,
            error: Value::Null,
        }
    }
}

fn malformed(reason: &str) -> Error {
    Error::Malformed {
        reason: reason.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::framing::Framer;

    /// Bytes captured from `ovsdb-server` 3.1 (strace of an `ovs-vsctl` run
    /// and of a monitor session).
    const CAPTURED: &[u8] = br#"{"id":0,"result":["Open_vSwitch"],"error":null}{"id":"echo","method":"echo","params":[]}{"id":null,"method":"update2","params":[["monid","SB_Global"],{"SB_Global":{"4a3b2c1d-0000-4000-8000-000000000001":{"modify":{"ipsec":true}}}}]}{"id":2,"result":null,"error":{"error":"unknown method","details":"no method named foo"}}"#;

    #[test]
    fn classifies_captured_server_bytes() {
        let mut f = Framer::default();
        let msgs: Vec<_> = f
            .feed(CAPTURED)
            .unwrap()
            .into_iter()
            .map(|v| Message::from_value(v).unwrap())
            .collect();
        assert_eq!(msgs.len(), 4);
        assert!(
            matches!(&msgs[0], Message::Response { id, error, .. } if *id == json!(0) && error.is_null())
        );
        assert!(matches!(&msgs[1], Message::Request { method, .. } if method == "echo"));
        assert!(matches!(&msgs[2], Message::Notification { method, .. } if method == "update2"));
        assert!(matches!(&msgs[3], Message::Response { error, .. } if !error.is_null()));
    }

    #[test]
    fn round_trips() {
        let msgs = [
            Message::Request {
                id: json!(7),
                method: "transact".into(),
                params: json!(["db"]),
            },
            Message::Notification {
                method: "update".into(),
                params: json!([null, {}]),
            },
            Message::Response {
                id: json!("echo"),
                result: json!([]),
                error: Value::Null,
            },
        ];
        for m in msgs {
            let mut bytes = Vec::new();
            m.write_to(&mut bytes).unwrap();
            let back = Framer::default().feed(&bytes).unwrap().remove(0);
            assert_eq!(Message::from_value(back).unwrap(), m);
        }
    }

    #[test]
    fn rejects_wrong_shapes() {
        for v in [
            json!([1]),
            json!({"id": 1}),
            json!({"method": 3}),
            json!({"method": "x", "params": 1}),
        ] {
            assert!(matches!(
                Message::from_value(v),
                Err(Error::Malformed { .. })
            ));
        }
    }

    #[test]
    fn echo_reply_mirrors_params() {
        let r = Message::echo_reply(json!("echo"), json!(["x"]));
        assert_eq!(
            r.to_value(),
            json!({"id":"echo","result":["x"],"error":null})
        );
    }
}
