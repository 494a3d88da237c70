"""The model broker: OpenAI chat, Responses and Anthropic Messages endpoints in front of pluggable providers.

Workers authenticate with their capability token; the broker holds the provider keys, counts tokens offline,
reserves the worst case before each call and settles after it.
"""

from swarmyard.broker.app import Broker, broker_routes, create_broker_app
from swarmyard.broker.settings import BrokerSettings, ModelRoute

__all__ = ["Broker", "BrokerSettings", "ModelRoute", "broker_routes", "create_broker_app"]
