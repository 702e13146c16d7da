//! The streaming batch pipeline (decode threads → one device worker → encode threads).
