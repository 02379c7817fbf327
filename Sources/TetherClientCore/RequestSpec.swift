import TetherProtocol

/// An HTTP method the SDK uses.
public enum HTTPVerb: String, Sendable, Hashable {
    /// `GET`
    case get = "GET"
    /// `POST`
    case post = "POST"
    /// `DELETE`
    case delete = "DELETE"
    /// `PATCH` (App Context set)
    case patch = "PATCH"
}

/// One query parameter, unencoded.
package struct QueryItem: Sendable, Hashable {
    /// The parameter name.
    package var name: String
    /// The parameter value (unencoded).
    package var value: String
    /// Creates a query item.
    package init(_ name: String, _ value: String) {
        self.name = name
        self.value = value
    }
}

/// A request described as data, independent of any HTTP library: what the transport must send.
package struct RequestSpec: Sendable, Hashable {
    /// The API call this request performs.
    package var operation: TetherOperation
    /// The HTTP method.
    package var method: HTTPVerb
    /// The path, each segment already percent-encoded (pubnub-wire §1.2).
    package var path: String
    /// Query parameters in the order they are sent.
    package var query: [QueryItem]
    /// The body (POST publish, grant token), JSON.
    package var body: [UInt8]?
    /// A timeout for this request only, overriding the configuration's.
    package var timeout: Duration?
    /// Extra request header fields (App Context's `If-Match`).
    package var headers: [String: String] = [:]
    /// Whether the request sends the client's auth key or token (most do; `time`, the admin
    /// calls signed with the secret key do not).
    package var carriesAuth = false

    /// Creates a request.
    package init(operation: TetherOperation, method: HTTPVerb = .get, path: String, query: [QueryItem] = [],
                body: [UInt8]? = nil, timeout: Duration? = nil) {
        self.operation = operation
        self.method = method
        self.path = path
        self.query = query
        self.body = body
        self.timeout = timeout
    }

    /// The request target: path and percent-encoded query string. Commas stay raw, as PubNub
    /// SDKs send list values (`channel-group=g1,g2`).
    package var target: String {
        guard !query.isEmpty else { return path }
        func encode(_ text: String) -> String {
            text.split(separator: ",", omittingEmptySubsequences: false).map { PercentCoding.encode($0) }.joined(separator: ",")
        }
        return path + "?" + query.map { "\(encode($0.name))=\(encode($0.value))" }.joined(separator: "&")
    }

    /// The first value of a query parameter.
    package func queryValue(_ name: String) -> String? { query.first { $0.name == name }?.value }

    /// Appends a query parameter.
    package mutating func append(_ name: String, _ value: String) { query.append(QueryItem(name, value)) }

    /// The same request with `token` as its auth (none when `nil` or empty), for a request sent
    /// again after the app replaced its token; a request that sends no auth is unchanged.
    package func withAuth(_ token: String?) -> RequestSpec {
        guard carriesAuth else { return self }
        var spec = self
        spec.query.removeAll { $0.name == "auth" }
        if let token, !token.isEmpty { spec.append("auth", token) }
        return spec
    }
}

/// The identity and keys every request is built from.
package struct RequestContext: Sendable, Hashable {
    /// Publish key (needed by publish, signal, fire).
    package var publishKey: String?
    /// Subscribe key.
    package var subscribeKey: String
    /// The client's user id (`uuid`).
    package var userId: String
    /// Legacy auth key or Access Manager v3 token (`auth`).
    package var authKey: String?
    /// The SDK name sent as `pnsdk`.
    package var sdkName: String

    /// Creates a context.
    package init(publishKey: String?, subscribeKey: String, userId: String, authKey: String?, sdkName: String = "Tether-Swift/0.1") {
        self.publishKey = publishKey
        self.subscribeKey = subscribeKey
        self.userId = userId
        self.authKey = authKey
        self.sdkName = sdkName
    }
}
