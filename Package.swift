// swift-tools-version: 6.2
// Tether: a realtime messaging server (PubNub-compatible wire) and Swift client SDK.
import PackageDescription

/// Strict settings for every target we own: Swift 6 language mode is the package default;
/// these add the upcoming features the codebase is written against.
let strictSettings: [SwiftSetting] = [
    .enableUpcomingFeature("ExistentialAny"),
    .enableUpcomingFeature("InternalImportsByDefault"),
    .enableUpcomingFeature("MemberImportVisibility"),
]

let package = Package(
    name: "Tether",
    platforms: [.macOS(.v15), .iOS(.v18), .tvOS(.v18), .visionOS(.v2)],
    products: [
        .library(name: "TetherProtocol", targets: ["TetherProtocol"]),
        .library(name: "TetherServer", targets: ["TetherServer"]),
        .library(name: "Tether", targets: ["Tether"]),
        .library(name: "TetherTesting", targets: ["TetherTesting"]),
        .library(name: "TetherTestingServer", targets: ["TetherTestingServer"]),
        // The pure cores, as products only so that Benchmarks/ (a separate package) can link them.
        .library(name: "TetherServerCore", targets: ["TetherServerCore"]),
        .library(name: "TetherClientCore", targets: ["TetherClientCore"]),
        .executable(name: "tether", targets: ["TetherCLI"]),
    ],
    dependencies: [
        .package(url: "https://github.com/hummingbird-project/hummingbird.git", from: "2.28.1"),
        .package(url: "https://github.com/hummingbird-project/hummingbird-websocket.git", from: "2.8.1"),
        .package(url: "https://github.com/swift-server/async-http-client.git", from: "1.37.0"),
        .package(url: "https://github.com/apple/swift-nio.git", from: "2.101.3"),
        .package(url: "https://github.com/apple/swift-nio-extras.git", from: "1.35.2"),
        .package(url: "https://github.com/apple/swift-collections.git", from: "1.6.0"),
        .package(url: "https://github.com/groue/GRDB.swift.git", from: "7.10.0"),
        .package(url: "https://github.com/apple/swift-log.git", from: "1.16.2"),
        .package(url: "https://github.com/apple/swift-metrics.git", from: "2.13.0"),
        .package(url: "https://github.com/swift-server/swift-prometheus.git", from: "2.4.1"),
        .package(url: "https://github.com/swift-server/swift-service-lifecycle.git", from: "2.13.0"),
        .package(url: "https://github.com/apple/swift-argument-parser.git", from: "1.8.2"),
        .package(url: "https://github.com/apple/swift-nio-ssl.git", from: "2.37.6"),
        .package(url: "https://github.com/apple/swift-crypto.git", from: "4.5.2"),
        .package(url: "https://github.com/pointfreeco/swift-clocks.git", from: "1.1.1"),
        .package(url: "https://github.com/apple/swift-http-types.git", from: "1.8.0"),
        .package(url: "https://github.com/x-sheep/swift-property-based.git", from: "2.0.1"),
        // The local HTTP/2 push gateway of the test kit (already in the graph through async-http-client).
        .package(url: "https://github.com/apple/swift-nio-http2.git", from: "1.36.0"),
        // The shared store of a multi-node deployment (`tether serve --database-url postgres://…`).
        .package(url: "https://github.com/vapor/postgres-nio.git", from: "1.33.2"),
    ],
    targets: [
        .target(
            name: "TetherProtocol",
            swiftSettings: strictSettings
        ),
        .target(
            name: "TetherServerCore",
            dependencies: ["TetherProtocol", .product(name: "DequeModule", package: "swift-collections")],
            swiftSettings: strictSettings
        ),
        .systemLibrary(name: "CZlib", pkgConfig: "zlib", providers: [.apt(["zlib1g-dev"])]),
        .target(
            name: "TetherServer",
            dependencies: [
                "TetherProtocol",
                "TetherServerCore",
                "CZlib",
                .product(name: "DequeModule", package: "swift-collections"),
                .product(name: "Hummingbird", package: "hummingbird"),
                .product(name: "HummingbirdCore", package: "hummingbird"),
                .product(name: "HummingbirdTLS", package: "hummingbird"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOWebSocket", package: "swift-nio"),
                .product(name: "NIOSSL", package: "swift-nio-ssl"),
                .product(name: "NIOHTTP1", package: "swift-nio"),
                .product(name: "NIOHTTPTypes", package: "swift-nio-extras"),
                .product(name: "NIOHTTPTypesHTTP1", package: "swift-nio-extras"),
                .product(name: "HTTPTypes", package: "swift-http-types"),
                .product(name: "Crypto", package: "swift-crypto"),
                // Push providers: APNs (HTTP/2, ES256 JWT), FCM (RS256 service-account JWT), webhooks.
                .product(name: "AsyncHTTPClient", package: "async-http-client"),
                .product(name: "CryptoExtras", package: "swift-crypto"),
                .product(name: "GRDB", package: "GRDB.swift"),
                .product(name: "PostgresNIO", package: "postgres-nio"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "CoreMetrics", package: "swift-metrics"),
                .product(name: "Metrics", package: "swift-metrics"),
                .product(name: "Prometheus", package: "swift-prometheus"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
                .product(name: "UnixSignals", package: "swift-service-lifecycle"),
            ],
            swiftSettings: strictSettings
        ),
        // The `tether` executable: the operator's tool (serve, store, client commands). Its
        // `bench` and `chaos` subcommands come from TetherHarness.
        .executableTarget(
            name: "TetherCLI",
            dependencies: [
                "TetherServer",
                "Tether",
                "TetherHarness",
                .product(name: "Logging", package: "swift-log"),
                .product(name: "Prometheus", package: "swift-prometheus"),
                .product(name: "ArgumentParser", package: "swift-argument-parser"),
            ],
            swiftSettings: strictSettings
        ),
        // Benchmark and chaos harness behind `tether bench` and `tether chaos`: load generators,
        // spawned `tether serve` processes, fault-injection scenarios and their reports.
        .target(
            name: "TetherHarness",
            dependencies: [
                "Tether",
                "TetherTesting",
                "TetherServerCore",
                "TetherProtocol",
                .product(name: "AsyncHTTPClient", package: "async-http-client"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "NIOHTTP1", package: "swift-nio"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "ArgumentParser", package: "swift-argument-parser"),
            ],
            swiftSettings: strictSettings
        ),
        .target(
            name: "TetherClientCore",
            dependencies: ["TetherProtocol"],
            swiftSettings: strictSettings
        ),
        .target(name: "CTetherNetlink"),
        .target(
            name: "Tether",
            dependencies: [
                "TetherProtocol",
                "TetherClientCore",
                .target(name: "CTetherNetlink", condition: .when(platforms: [.linux])),
                .product(name: "AsyncHTTPClient", package: "async-http-client"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "NIOHTTP1", package: "swift-nio"),
                .product(name: "NIOWebSocket", package: "swift-nio"),
                .product(name: "NIOSSL", package: "swift-nio-ssl"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "Crypto", package: "swift-crypto"),
                .product(name: "CryptoExtras", package: "swift-crypto"),
            ],
            swiftSettings: strictSettings
        ),
        // The test kit without a server: in-memory transport, manual clock, fault-injecting proxy,
        // scripted and raw fake servers, test certificates. Client tests link it without linking
        // TetherServer.
        .target(
            name: "TetherTesting",
            dependencies: [
                "Tether",
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "NIOHTTP1", package: "swift-nio"),
                .product(name: "NIOSSL", package: "swift-nio-ssl"),
                .product(name: "NIOHTTP2", package: "swift-nio-http2"),
                .product(name: "Logging", package: "swift-log"),
            ],
            resources: [.copy("Certificates")],
            swiftSettings: strictSettings
        ),
        // The one in-process launcher of a real Tether server, for tests that need the server.
        .target(
            name: "TetherTestingServer",
            dependencies: [
                "TetherServer",
                .product(name: "Logging", package: "swift-log"),
            ],
            swiftSettings: strictSettings
        ),
        .testTarget(
            name: "TetherClientCoreTests",
            dependencies: ["TetherClientCore", "TetherProtocol", .product(name: "Clocks", package: "swift-clocks")],
            swiftSettings: strictSettings
        ),
        .testTarget(
            name: "TetherTests",
            dependencies: [
                "Tether",
                "TetherTesting",
                "TetherHarness",
                "TetherTestingServer",
                "TetherServer",
                "TetherProtocol",
                .product(name: "AsyncHTTPClient", package: "async-http-client"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "Clocks", package: "swift-clocks"),
                .product(name: "NIOHTTP1", package: "swift-nio"),
            ],
            exclude: ["Fixtures"],
            swiftSettings: strictSettings
        ),
        .testTarget(
            name: "TetherProtocolTests",
            dependencies: ["TetherProtocol"],
            swiftSettings: strictSettings
        ),
        .testTarget(
            name: "TetherParserPropertyTests",
            dependencies: [
                "TetherServer",
                "TetherProtocol",
                .product(name: "HTTPTypes", package: "swift-http-types"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "PropertyBased", package: "swift-property-based"),
            ],
            swiftSettings: strictSettings
        ),
        .testTarget(
            name: "TetherServerCoreTests",
            dependencies: ["TetherServerCore", "TetherProtocol"],
            swiftSettings: strictSettings
        ),
        .testTarget(
            name: "TetherServerTests",
            dependencies: [
                "TetherServer",
                "TetherServerCore",
                "TetherTestingServer",
                "TetherTesting",
                "TetherProtocol",
                "CZlib",
                .product(name: "AsyncHTTPClient", package: "async-http-client"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOHTTP1", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "NIOSSL", package: "swift-nio-ssl"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "Clocks", package: "swift-clocks"),
                .product(name: "GRDB", package: "GRDB.swift"),
                .product(name: "HummingbirdWSClient", package: "hummingbird-websocket"),
                .product(name: "NIOWebSocket", package: "swift-nio"),
                .product(name: "Crypto", package: "swift-crypto"),
                .product(name: "CryptoExtras", package: "swift-crypto"),
            ],
            swiftSettings: strictSettings
        ),
    ]
)
