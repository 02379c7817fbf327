// The Tether client SDK.
