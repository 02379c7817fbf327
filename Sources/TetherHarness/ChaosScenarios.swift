import Foundation

/// One situation from the seeds, as the suite reproduces it.
struct ChaosScenario: Sendable {
    /// Scenario names, as `--scenario` takes them.
    enum ID: String, CaseIterable, Sendable, Codable {
        case tunnel
        case wifiToCellular = "wifi-to-cellular"
        case serverRestart = "server-restart"
        case serverDown = "server-down"
        case captivePortal = "captive-portal"
        case grantRevoked = "grant-revoked"
        case overload
        case slowLink = "slow-link"
        case outageBacklog = "outage-backlog"
        case reconnectionStorm = "reconnection-storm"
        case publisherFlapping = "publisher-flapping"
        case background
    }

    let id: ID
    /// The table's row label.
    let title: String
    /// What the suite does, for the docs and `--list`.
    let summary: String
    /// Messages published per second while the scenario runs (directly to the server).
    let publishRate: Double
    /// Whether the clients run in a network namespace (needs root and `ip`).
    var needsNamespace = false
    /// Whether the channel is protected by Access Manager (auth key grants).
    var usesAccessManager = false
    /// Whether every SDK runs the storm's many clients instead of one.
    var isStorm = false
    /// Whether the clients connect to the server itself rather than through the fault proxy
    /// (the server's own restarts: a proxy in between would turn "refused" into "closed").
    var direct = false
    /// Whether the SDKs publish (and history is counted) instead of subscribing.
    var isPublisherSide = false
    /// Whether this is the app-lifecycle scenario (its own columns and table: ``ChaosLifecycleColumn``).
    var isLifecycle = false

    /// Every scenario, in the order of the report.
    static let all: [ChaosScenario] = [
        ChaosScenario(id: .tunnel, title: "Tunnel (blackhole 30 s)",
                      summary: "Every socket stays open but nothing flows for 30 s (the broken pipe of seed 001), then traffic resumes.",
                      publishRate: 10),
        ChaosScenario(id: .wifiToCellular, title: "Wi-Fi → cellular",
                      summary: "Clients in a network namespace with two links; every connection is reset and Wi-Fi goes down, "
                          + "so traffic moves to cellular with a new source address.",
                      publishRate: 10, needsNamespace: true),
        ChaosScenario(id: .serverRestart, title: "Server restart",
                      summary: "SIGTERM to the server (waiting long-polls are answered), then it starts again on the same port and data.",
                      publishRate: 10, direct: true),
        ChaosScenario(id: .serverDown, title: "Server down 2 min",
                      summary: "The server stops for 120 s (connections refused), publishes fail meanwhile, then it starts again.",
                      publishRate: 10, direct: true),
        ChaosScenario(id: .captivePortal, title: "Captive portal 20 s",
                      summary: "Every open connection is reset and every request is answered with an HTML sign-in page for 20 s "
                          + "(a WebSocket upgrade too).", publishRate: 10),
        ChaosScenario(id: .grantRevoked, title: "Grant revoked, then restored",
                      summary: "The clients' auth key loses read access to the channel (403) for 20 s, then the grant is restored.",
                      publishRate: 10, usesAccessManager: true),
        ChaosScenario(id: .overload, title: "Overload (429, Retry-After 5)",
                      summary: "Every open connection is reset and every request (a WebSocket upgrade too) is answered "
                          + "429 Too Many Requests with Retry-After: 5 for 20 s.", publishRate: 10),
        ChaosScenario(id: .slowLink, title: "Slow link",
                      summary: "Every chunk is delayed 12 s ± 1 s in each direction for 40 s, so requests time out.", publishRate: 10),
        ChaosScenario(id: .outageBacklog, title: "5,000 messages during a 60 s outage",
                      summary: "Every connection is reset and refused for 60 s while 5,000 messages are published.",
                      publishRate: 5000.0 / 60.0),
        ChaosScenario(id: .reconnectionStorm, title: "Reconnection storm",
                      summary: "Hundreds of clients per SDK; the server restarts (down 5 s) and every client reconnects at once.",
                      publishRate: 2, isStorm: true, direct: true),
        ChaosScenario(id: .publisherFlapping, title: "Publisher: flapping link and a server restart",
                      summary: "Each SDK publishes 300 numbered messages through a link that flaps (resets, responses dropped "
                          + "after the server stored the message, blackholes) while the server restarts once; history is counted.",
                      publishRate: 10, isPublisherSide: true),
        ChaosScenario(id: .background, title: "Background 10 min, then foreground",
                      summary: "Each app is told it goes to the background (Tether: enterBackground() with each policy and preset; "
                          + "PubNub: its recipe, unsubscribe and remember the last timetoken), then frozen with SIGSTOP for 600 s "
                          + "while messages are published; then SIGCONT and foreground (Tether: enterForeground(); PubNub: "
                          + "history since the saved timetoken, paged, live messages cached, then delivered in order).",
                      publishRate: 5, direct: true, isLifecycle: true),
    ]
}
