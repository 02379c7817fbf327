/// The JSON error bodies of pubnub-wire §3, one builder per service family, so every error a
/// Tether server produces is JSON that PubNub SDKs classify correctly.
package enum ErrorBody {
    /// Publish, signal and fire errors: `[0,"<text>","<timetoken>"]`.
    ///
    /// Clients recognise the texts `Invalid Key`, `Invalid JSON`, `Message Too Large` and
    /// `Signal size too large`.
    package static func publish(_ text: String, timetoken: Timetoken) -> [UInt8] {
        var w = JSONWriter()
        w.raw("[0,")
        w.string(text)
        w.raw(",")
        w.timetokenString(timetoken)
        w.raw("]")
        return w.bytes
    }

    /// The generic object form: `{"status":N,"error":true,"service":"…","message":"…"}`.
    package static func service(status: Int, service: String, message: String) -> [UInt8] {
        var w = JSONWriter()
        w.raw("{\"status\":")
        w.number(status)
        w.raw(",\"error\":true,\"service\":")
        w.string(service)
        w.raw(",\"message\":")
        w.string(message)
        w.raw("}")
        return w.bytes
    }

    /// The history v3 form: `{"status":N,"error":true,"error_message":"…","channels":{}}`.
    package static func history(status: Int, message: String) -> [UInt8] {
        var w = JSONWriter()
        w.raw("{\"status\":")
        w.number(status)
        w.raw(",\"error\":true,\"error_message\":")
        w.string(message)
        w.raw(",\"channels\":{}}")
        return w.bytes
    }

    /// Access Manager denial listing only the denied channels and groups (pubnub-wire §6.5).
    package static func forbidden(channels: [String], groups: [String], message: String = "Forbidden") -> [UInt8] {
        var w = JSONWriter()
        w.raw("{\"message\":")
        w.string(message)
        w.raw(",\"payload\":{")
        var wroteChannels = false
        if !channels.isEmpty || groups.isEmpty {
            w.raw("\"channels\":")
            w.stringArray(channels)
            wroteChannels = true
        }
        if !groups.isEmpty {
            if wroteChannels { w.raw(",") }
            w.raw("\"channel-groups\":")
            w.stringArray(groups)
        }
        w.raw("},\"error\":true,\"service\":\"Access Manager\",\"status\":403}")
        return w.bytes
    }
}
