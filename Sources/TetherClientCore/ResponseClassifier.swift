@_spi(Benchmarks) package import TetherProtocol

/// What the server said when it refused a request, decoded from its error body.
package struct ServerErrorDetails: Sendable, Hashable {
    /// The HTTP status code (or the body's `status` when a 200 carried an error object).
    package var statusCode: Int
    /// The body's message (`message`, `error_message`, `error` or `error.message`), when there is one.
    package var message: String?
    /// The body's `service`, when there is one.
    package var service: String?
    /// Channels Access Manager denied (`payload.channels`).
    package var deniedChannels: [String]
    /// Channel groups Access Manager denied (`payload.channel-groups`).
    package var deniedGroups: [String]
    /// The raw body text (truncated to 2 KiB) for logs and diagnostics.
    package var body: String

    /// Creates details.
    package init(statusCode: Int, message: String? = nil, service: String? = nil, deniedChannels: [String] = [],
                deniedGroups: [String] = [], body: String = "") {
        self.statusCode = statusCode
        self.message = message
        self.service = service
        self.deniedChannels = deniedChannels
        self.deniedGroups = deniedGroups
        self.body = body
    }
}

/// The outcome of classifying one HTTP response.
package enum ClassifiedResponse: Sendable, Hashable {
    /// A 2xx response with a JSON body.
    case success(JSONValue)
    /// A failure: its category and what the server said.
    case failure(StatusCategory, ServerErrorDetails)
}

/// Maps HTTP responses onto success or a ``StatusCategory`` (pubnub-wire §3, §13.2), purely.
///
/// Rules, in order:
/// 1. 400, 413, 414 → bad request; 403 → access denied (with `payload.channels` and
///    `payload.channel-groups`); 481 → malformed filter expression — whatever the body, except a
///    403 whose body is there and not JSON: a proxy's HTML "access denied" page is a malformed
///    response (seed 002), not a refusal by Access Manager (whose answer is JSON).
/// 2. A body that is not JSON → malformed response (captive portals, proxies, truncated bodies),
///    for any other status.
/// 3. 2xx JSON → success, unless the object carries `"error": true` with a numeric `status` ≥ 400,
///    which is classified as that status (as PubNub's JavaScript SDK does).
/// 4. Anything else (429, 5xx, unexpected codes) → unknown, with the status code kept.
package enum ResponseClassifier {
    /// Classifies a response.
    package static func classify(statusCode: Int, body: [UInt8]) -> ClassifiedResponse {
        // Up to the answer depth: a message a server stored before it limited stored values
        // is read, rather than failing every read of its channel.
        let parsed = try? JSONValue(parsing: body, maximumDepth: JSONText.maximumAnswerDepth)
        let bodyText = String(decoding: body.prefix(2048), as: UTF8.self)
        var effective = statusCode
        if (200..<300).contains(statusCode), let parsed, let embedded = embeddedErrorStatus(parsed) {
            effective = embedded
        }
        if (200..<300).contains(effective) {
            guard let parsed else {
                return .failure(.malformedResponse, ServerErrorDetails(statusCode: statusCode, message: "the response is not JSON", body: bodyText))
            }
            return .success(parsed)
        }
        var details = parsed.map { decodeError($0, statusCode: effective) } ?? ServerErrorDetails(statusCode: effective)
        details.body = bodyText
        switch effective {
        case 400, 413, 414: return .failure(.badRequest, details)
        case 403:
            if parsed == nil, body.contains(where: { $0 > 0x20 }) {
                if details.message == nil { details.message = "a 403 that is not JSON (a proxy's page?)" }
                return .failure(.malformedResponse, details)
            }
            return .failure(.accessDenied, details)
        case 481: return .failure(.malformedFilterExpression, details)
        default:
            guard parsed != nil else {
                if details.message == nil { details.message = "the response is not JSON" }
                return .failure(.malformedResponse, details)
            }
            return .failure(.unknown, details)
        }
    }

    /// The numeric `status` ≥ 400 of a 200 body whose `error` is true (or 1).
    static func embeddedErrorStatus(_ value: JSONValue) -> Int? {
        guard let object = value.objectValue, let status = object["status"]?.intValue, status >= 400 else { return nil }
        switch object["error"] {
        case .bool(true)?: return status
        case .number(let n)? where n.exactInteger != 0: return status
        case .object?: return status
        default: return nil
        }
    }

    /// Decodes PubNub's error-body variants (pubnub-wire §3).
    package static func decodeError(_ value: JSONValue, statusCode: Int) -> ServerErrorDetails {
        var details = ServerErrorDetails(statusCode: statusCode)
        switch value {
        case .array(let items):
            // Publish family: [0, "Invalid Key", "<tt>"].
            details.message = items.count > 1 ? items[1].stringValue : nil
        case .object(let object):
            details.service = object["service"]?.stringValue
            details.message = object["message"]?.stringValue ?? object["error_message"]?.stringValue.flatMap { $0.isEmpty ? nil : $0 }
                ?? object["error"]?.stringValue ?? object["error"]?["message"]?.stringValue
            // App Context's 400 names what was wrong in `error.details[].message`.
            if let detail = object["error"]?["details"]?[0]?["message"]?.stringValue, let message = details.message {
                details.message = "\(message) \(detail)"
            }
            if let payload = object["payload"]?.objectValue {
                details.deniedChannels = payload["channels"]?.arrayValue?.compactMap(\.stringValue) ?? []
                details.deniedGroups = payload["channel-groups"]?.arrayValue?.compactMap(\.stringValue) ?? []
            }
        default:
            break
        }
        return details
    }
}
