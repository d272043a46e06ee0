"""A literal transcription of ACEBench's Chinese platforms (ACEBench/ACEBench at e6db74b), the official side
of tests/test_acebench_zh_agent.py.

Each section names its file under model_inference/multi_turn/scenarioszh/ (the multi_step copies differ
only in comments). The code is upstream's, MIT licence, with imports, comments and docstrings removed
(the module's code as ``ast.unparse`` writes it); the classes are used one instance each, as upstream's
executor does. Not lopd code: nothing outside the tests imports it.
"""
# ruff: noqa
from datetime import datetime, timedelta
from typing import Dict, List, Union


# ---- model_inference/multi_turn/scenarioszh/phone_platform/base_api.py

class BaseApi:

    def __init__(self):
        self.wifi = False
        self.logged_in = True

    def _load_scenario(self, scenario: dict, long_context=False) -> None:
        self.wifi = scenario.get('wifi', False)
        self.logged_in = scenario.get('logged_in', True)

    def turn_on_wifi(self):
        self.wifi = True
        return {'status': True, 'message': 'wifi已经打开'}

    def login_device(self):
        self.logged_in = True
        return {'status': True, 'message': '设备已经登录'}


# ---- model_inference/multi_turn/scenarioszh/phone_platform/message.py

class MessageApi(BaseApi):

    def __init__(self):
        super().__init__()
        '\n        Initialize the MessageAPI with six users and their messages.\n        '
        self.max_capacity = 6
        self.user_list: Dict[str, Dict[str, Union[str, int]]] = {'Eve': {'user_id': 'USR100', 'phone_number': '123-456-7890', 'occupation': 'Software Engineer'}, 'Frank': {'user_id': 'USR101', 'phone_number': '234-567-8901', 'occupation': 'Data Scientist'}, 'Grace': {'user_id': 'USR102', 'phone_number': '345-678-9012', 'occupation': 'Product Manager'}, 'Helen': {'user_id': 'USR103', 'phone_number': '456-789-0123', 'occupation': 'UX Designer'}, 'Isaac': {'user_id': 'USR104', 'phone_number': '567-890-1234', 'occupation': 'DevOps Engineer'}, 'Jack': {'user_id': 'USR105', 'phone_number': '678-901-2345', 'occupation': 'Marketing Specialist'}}
        self.inbox: Dict[int, Dict[str, Union[str, int]]] = {1: {'sender_id': 'USR100', 'receiver_id': 'USR101', 'message': "Hey Frank, don't forget about our meeting on 2024-06-11 at 4 PM in Conference Room 1.", 'time': '2024-06-09'}, 2: {'sender_id': 'USR101', 'receiver_id': 'USR102', 'message': '你能帮我点一个"玛格丽特披萨"的外卖吗,商家是达美乐。', 'time': '2024-03-09'}, 3: {'sender_id': 'USR102', 'receiver_id': 'USR103', 'message': '帮我查一些喜茶有哪些奶茶外卖，买一杯便宜些的奶茶。买完以后记得回复我,回复的内容是（已经买好了）', 'time': '2023-12-05'}, 4: {'sender_id': 'USR103', 'receiver_id': 'USR102', 'message': 'No problem Helen, I can assist you.', 'time': '2024-09-09'}, 5: {'sender_id': 'USR104', 'receiver_id': 'USR105', 'message': 'Isaac, are you available for a call?', 'time': '2024-06-06'}, 6: {'sender_id': 'USR105', 'receiver_id': 'USR104', 'message': "Yes Jack, let's do it in 30 minutes.", 'time': '2024-01-15'}}
        self.message_id_counter: int = 6

    def _load_scenario(self, scenario: dict, long_context=False) -> None:
        self.wifi = scenario.get('wifi', False)
        self.logged_in = scenario.get('logged_in', True)

    def send_message(self, sender_name: str, receiver_name: str, message: str) -> Dict[str, Union[bool, str]]:
        if self.logged_in == False:
            return {'status': False, 'message': 'device未登录，无法发送短信'}
        if self.wifi == False:
            return {'status': False, 'message': 'wifi关闭，此时不能发送信息'}
        if len(self.inbox) >= self.max_capacity:
            return {'status': False, 'message': '内存容量不够了，你需要询问user删除哪一条短信。'}
        if sender_name not in self.user_list or receiver_name not in self.user_list:
            return {'status': False, 'message': '发送者或接收者不存在'}
        sender_id = self.user_list[sender_name]['user_id']
        receiver_id = self.user_list[receiver_name]['user_id']
        self.message_id_counter += 1
        self.inbox[self.message_id_counter] = {'sender_id': sender_id, 'receiver_id': receiver_id, 'message': message}
        return {'status': True, 'message': f'短信成功发送给{receiver_name}。'}

    def delete_message(self, message_id: int) -> Dict[str, Union[bool, str]]:
        if self.logged_in == False:
            return {'status': False, 'message': 'device未登录，无法删除短信'}
        if message_id not in self.inbox:
            return {'status': False, 'message': '短信ID不存在'}
        del self.inbox[message_id]
        return {'status': True, 'message': f'短信ID {message_id} 已成功删除。'}

    def view_messages_between_users(self, sender_name: str, receiver_name: str) -> Dict[str, Union[bool, str, List[Dict[str, str]]]]:
        if self.logged_in == False:
            return {'status': False, 'message': 'device未登录，无法查看短信信息'}
        if sender_name not in self.user_list:
            return {'status': False, 'message': '发送者不存在'}
        if receiver_name not in self.user_list:
            return {'status': False, 'message': '接收者不存在'}
        sender_id = self.user_list[sender_name]['user_id']
        receiver_id = self.user_list[receiver_name]['user_id']
        messages_between_users = []
        for msg_id, msg_data in self.inbox.items():
            if msg_data['sender_id'] == sender_id and msg_data['receiver_id'] == receiver_id:
                messages_between_users.append({'id': msg_id, 'sender': sender_name, 'receiver': receiver_name, 'message': msg_data['message']})
        if not messages_between_users:
            return {'status': False, 'message': '没有找到相关的短信记录'}
        return {'status': True, 'messages': messages_between_users}

    def search_messages(self, user_name: str, keyword: str) -> Dict[str, Union[str, List[Dict[str, str]]]]:
        if user_name not in self.user_list:
            return {'status': False, 'message': '用户不存在'}
        user_id = self.user_list[user_name]['user_id']
        matched_messages = []
        for msg_id, msg_data in self.inbox.items():
            if (msg_data['sender_id'] == user_id or msg_data['receiver_id'] == user_id) and keyword.lower() in msg_data['message'].lower():
                matched_messages.append({'id': msg_id, 'sender_id': msg_data['sender_id'], 'receiver_id': msg_data['receiver_id'], 'message': msg_data['message']})
        if not matched_messages:
            return {'status': False, 'message': '没有找到包含关键词的短信'}
        return {'status': True, 'messages': matched_messages}

    def get_all_message_times_with_ids(self) -> Dict[int, str]:
        if self.logged_in == False:
            return {'status': False, 'message': 'device未登录，获取所有短信的时间以及对应的短信编号。'}
        message_times_with_ids = {msg_id: msg_data['time'] for msg_id, msg_data in self.inbox.items()}
        return message_times_with_ids

    def get_latest_message_id(self) -> Dict[str, Union[bool, str, int]]:
        if self.logged_in == False:
            return {'status': False, 'message': 'device未登录，无法获取最新发送的短信ID。'}
        if not self.inbox:
            return {'status': False, 'message': '短信记录为空'}
        latest_message_id = None
        latest_time = None
        for message_id, message_data in self.inbox.items():
            message_time = datetime.strptime(message_data['time'], '%Y-%m-%d')
            if latest_time is None or message_time > latest_time:
                latest_time = message_time
                latest_message_id = message_id
        return {'status': True, 'message': f'最新的短信ID是 {latest_message_id}', 'message_id': latest_message_id}

    def get_earliest_message_id(self) -> Dict[str, Union[bool, str, int]]:
        if self.logged_in == False:
            return {'status': False, 'message': 'device未登录，无法获取最早发送的短信ID'}
        if not self.inbox:
            return {'status': False, 'message': '短信记录为空'}
        earliest_message_id = None
        earliest_time = None
        for message_id, message_data in self.inbox.items():
            message_time = datetime.strptime(message_data['time'], '%Y-%m-%d')
            if earliest_time is None or message_time < earliest_time:
                earliest_time = message_time
                earliest_message_id = message_id
        return {'status': True, 'message': f'最早的短信ID是 {earliest_message_id}', 'message_id': earliest_message_id}


# ---- model_inference/multi_turn/scenarioszh/phone_platform/reminder.py

class ReminderApi(BaseApi):

    def __init__(self):
        self.max_capacity = 6
        self.reminder_list: Dict[int, Dict[str, Union[str, bool, datetime]]] = {1: {'reminder_id': 1001, 'title': "Doctor's Appointment", 'description': 'Visit Dr. Smith for a checkup.', 'time': '2024-07-15 09:30', 'notified': False}, 2: {'reminder_id': 1002, 'title': 'Team Meeting', 'description': 'Monthly project review with the team.', 'time': '2024-07-17 11:00', 'notified': False}, 3: {'reminder_id': 1003, 'title': 'To-do list', 'description': '首先帮Frank在"盒马生鲜"点外卖，需要定两个"生鲜大礼包"，再发短信告诉Frank："购买商品的价格是()元"。要把括号换成实际金额，保留一位小数。', 'time': '2024-07-16 11:00', 'notified': False}}
        self.reminder_id_counter: int = 3

    def _load_scenario(self, scenario: dict, long_context=False) -> None:
        self.wifi = scenario.get('wifi', False)
        self.logged_in = scenario.get('logged_in', True)

    def _check_capacity(self) -> bool:
        return len(self.reminder_list) >= self.max_capacity

    def view_reminder_by_title(self, title: str) -> Dict[str, Union[str, bool, Dict[str, Union[str, bool, datetime]]]]:
        if self.logged_in == False:
            return {'status': False, 'message': 'device未登录，无法查看提醒'}
        for reminder_id, reminder in self.reminder_list.items():
            if reminder['title'] == title:
                return {'status': True, 'reminder': reminder}
        return {'status': False, 'message': f"没有找到标题为 '{title}' 的提醒"}

    def add_reminder(self, title: str, description: str, time: datetime) -> Dict[str, Union[bool, str]]:
        if self.logged_in == False:
            return {'status': False, 'message': 'device未登录，无法添加一个新的提醒'}
        if self._check_capacity():
            return {'status': False, 'message': '提醒容量已满，无法添加新的提醒'}
        self.reminder_id_counter += 1
        reminder_id = self.reminder_id_counter
        self.reminder_list[reminder_id] = {'reminder_id': reminder_id, 'title': title, 'description': description, 'time': time, 'notified': False}
        return {'status': True, 'message': f"提醒 '{title}' 已成功添加"}

    def delete_reminder(self, reminder_id: int) -> Dict[str, Union[bool, str]]:
        if self.logged_in == False:
            return {'status': False, 'message': 'device未登录，无法删除指定的提醒'}
        if reminder_id not in self.reminder_list:
            return {'status': False, 'message': '提醒ID不存在'}
        del self.reminder_list[reminder_id]
        return {'status': True, 'message': f'提醒ID {reminder_id} 已成功删除'}

    def view_all_reminders(self) -> Dict[str, Union[bool, List[Dict[str, Union[str, datetime, bool]]]]]:
        if not self.reminder_list:
            return {'status': False, 'message': '没有任何提醒'}
        reminders = []
        for reminder in self.reminder_list.values():
            reminders.append({'title': reminder['title'], 'description': reminder['description'], 'time': reminder['time'], 'notified': reminder['notified']})
        return {'status': True, 'reminders': reminders}

    def mark_as_notified(self, reminder_id: int) -> Dict[str, Union[bool, str]]:
        if reminder_id not in self.reminder_list:
            return {'status': False, 'message': '提醒ID不存在'}
        self.reminder_list[reminder_id]['notified'] = True
        return {'status': True, 'message': f'提醒ID {reminder_id} 已标记为已通知'}

    def search_reminders(self, keyword: str) -> Dict[str, Union[bool, List[Dict[str, str]]]]:
        matched_reminders = []
        for reminder in self.reminder_list.values():
            if keyword.lower() in reminder['title'].lower() or keyword.lower() in reminder['description'].lower():
                matched_reminders.append({'title': reminder['title'], 'description': reminder['description'], 'time': reminder['time'].strftime('%Y-%m-%d %H:%M')})
        if not matched_reminders:
            return {'status': False, 'message': '没有找到包含该关键词的提醒'}
        return {'status': True, 'reminders': matched_reminders}


# ---- model_inference/multi_turn/scenarioszh/phone_platform/food_services.py

class FoodPlatform(BaseApi):

    def __init__(self):
        self.users: Dict[str, Dict[str, Union[str, float]]] = {'Eve': {'user_id': 'U100', 'password': 'password123', 'balance': 500.0}, 'Frank': {'user_id': 'U101', 'password': 'password456', 'balance': 300.0}, 'Grace': {'user_id': 'U102', 'password': 'password789', 'balance': 150.0}, 'Helen': {'user_id': 'U103', 'password': 'password321', 'balance': 800.0}, 'Isaac': {'user_id': 'U104', 'password': 'password654', 'balance': 400.0}, 'Jack': {'user_id': 'U105', 'password': 'password654', 'balance': 120.0}}
        self.merchant_list: Dict[str, Dict[str, Union[str, List[Dict[str, Union[str, float]]]]]] = {'达美乐': {'merchant_id': 'M100', 'service_type': 'Pizza', 'menu': [{'product': '玛格丽特披萨', 'price': 68.0}, {'product': '超级至尊披萨', 'price': 88.0}]}, '米村拌饭': {'merchant_id': 'M101', 'service_type': 'Bibimbap', 'menu': [{'product': '石锅拌饭', 'price': 35.0}, {'product': '韩式牛肉拌饭', 'price': 45.0}]}, '海底捞': {'merchant_id': 'M102', 'service_type': 'Hotpot', 'menu': [{'product': '牛肉卷', 'price': 68.0}, {'product': '海鲜拼盘', 'price': 88.0}]}, '喜茶': {'merchant_id': 'M103', 'service_type': 'Milk Tea', 'menu': [{'product': '芝士奶茶', 'price': 25.0}, {'product': '四季春奶茶', 'price': 22.0}]}, '盒马生鲜': {'merchant_id': 'M104', 'service_type': 'Fresh Grocery', 'menu': [{'product': '有机蔬菜包', 'price': 15.0}, {'product': '生鲜大礼包', 'price': 99.0}]}, '九田家烤肉': {'merchant_id': 'M105', 'service_type': 'BBQ', 'menu': [{'product': '韩式烤牛肉', 'price': 128.0}, {'product': '烤五花肉', 'price': 78.0}]}}
        self.logged_in_users: List[str] = []
        self.orders: List[Dict[str, Union[str, int, float, datetime]]] = []

    def _load_scenario(self, scenario: dict, long_context=False) -> None:
        self.wifi = scenario.get('wifi', False)
        self.logged_in = scenario.get('logged_in', True)
        self.logged_in_users = scenario.get('logged_in_users', [])

    def login_food_platform(self, username: str, password: str) -> Dict[str, Union[bool, str]]:
        if self.wifi == False:
            return {'status': False, 'message': 'wifi未打开，无法登录'}
        if username not in self.users:
            return {'status': False, 'message': '用户不存在'}
        if self.users[username]['password'] != password:
            return {'status': False, 'message': '密码错误'}
        if username in self.logged_in_users:
            return {'status': False, 'message': f'{username} 已经登录'}
        self.logged_in_users.append(username)
        return {'status': True, 'message': f'用户{username}登陆成功！'}

    def view_logged_in_users(self) -> Dict[str, Union[bool, List[str]]]:
        if not self.logged_in_users:
            return {'status': False, 'message': '当前没有登录food platform'}
        return {'status': True, 'logged_in_users': self.logged_in_users}

    def check_balance(self, user_name: str) -> float:
        if user_name in self.users:
            return self.users[user_name]['balance']
        else:
            print(f'用户 {user_name} 不存在!')
            return 0.0

    def add_food_delivery_order(self, username: str, merchant_name: str, items: List[Dict[str, Union[str, int]]]) -> Dict[str, Union[bool, str]]:
        if username not in self.logged_in_users:
            return {'status': False, 'message': f'用户 {username} 未登录food platform'}
        if merchant_name not in self.merchant_list:
            return {'status': False, 'message': '商家不存在'}
        total_price = 0.0
        order_items = []
        for item in items:
            product_name = item.get('product')
            quantity = item.get('quantity', 1)
            if not isinstance(quantity, int) or quantity <= 0:
                return {'status': False, 'message': f'无效的数量 {quantity} 对于商品 {product_name}'}
            product_found = False
            for product in self.merchant_list[merchant_name]['menu']:
                if product['product'] == product_name:
                    total_price += product['price'] * quantity
                    order_items.append({'product': product_name, 'quantity': quantity, 'price_per_unit': product['price']})
                    product_found = True
                    break
            if not product_found:
                return {'status': False, 'message': f'商品 {product_name} 不存在于 {merchant_name} 的菜单中'}
        if total_price >= self.users[username]['balance']:
            return {'status': False, 'message': '余额不足，无法下单'}
        self.users[username]['balance'] -= total_price
        order = {'user_name': username, 'merchant_name': merchant_name, 'items': order_items, 'total_price': total_price}
        self.orders.append(order)
        return {'status': True, 'message': f'外卖订单成功下单给 {merchant_name}，总金额为 {total_price} 元'}

    def get_products(self, merchant_name: str) -> Union[List[Dict[str, Union[str, float]]], str]:
        merchant = self.merchant_list.get(merchant_name)
        if merchant:
            return merchant['menu']
        else:
            return {'status': False, 'message': f"商家 '{merchant_name}' 不存在"}

    def view_orders(self, user_name: str) -> Dict[str, Union[bool, str, List[Dict[str, Union[str, int, float]]]]]:
        user_orders = [order for order in self.orders if order['user_name'] == user_name]
        if not user_orders:
            return {'status': False, 'message': '用户没有订单记录'}
        return {'status': True, 'orders': user_orders}

    def search_orders(self, keyword: str) -> Dict[str, Union[bool, str, List[Dict[str, Union[str, float]]]]]:
        matched_orders = [order for order in self.orders if keyword.lower() in order['merchant_name'].lower() or any((keyword.lower() in item.lower() for item in order.get('items', [])))]
        if not matched_orders:
            return {'status': False, 'message': '没有找到匹配的订单'}
        return {'status': True, 'orders': matched_orders}


# ---- model_inference/multi_turn/scenarioszh/travel.py

class Travel:

    def __init__(self):
        self.users = {'user1': {'user_name': 'Eve', 'password': 'password123', 'cash_balance': 2000.0, 'bank_balance': 50000.0, 'membership_level': 'regular'}, 'user2': {'user_name': 'Frank', 'password': 'password456', 'cash_balance': 8000.0, 'bank_balance': 8000.0, 'membership_level': 'silver'}, 'user3': {'user_name': 'Grace', 'password': 'password789', 'cash_balance': 1000.0, 'bank_balance': 5000.0, 'membership_level': 'gold'}}
        self.flights = [{'flight_no': 'CA1234', 'origin': '北京', 'destination': '上海', 'depart_time': '2024-07-15 08:00:00', 'arrival_time': '2024-07-15 10:30:00', 'status': 'available', 'seats_available': 5, 'economy_price': 1200, 'business_price': 3000}, {'flight_no': 'MU5678', 'origin': '上海', 'destination': '北京', 'depart_time': '2024-07-16 09:00:00', 'arrival_time': '2024-07-16 11:30:00', 'status': 'available', 'seats_available': 3, 'economy_price': 1900, 'business_price': 3000}, {'flight_no': 'CZ4321', 'origin': '上海', 'destination': '北京', 'depart_time': '2024-07-16 20:00:00', 'arrival_time': '2024-07-16 22:00:00', 'status': 'available', 'seats_available': 8, 'economy_price': 2500, 'business_price': 4000}, {'flight_no': 'CZ4352', 'origin': '上海', 'destination': '北京', 'depart_time': '2024-07-17 20:00:00', 'arrival_time': '2024-07-17 22:00:00', 'status': 'available', 'seats_available': 8, 'economy_price': 1600, 'business_price': 2500}, {'flight_no': 'MU3561', 'origin': '北京', 'destination': '南京', 'depart_time': '2024-07-18 08:00:00', 'arrival_time': '2024-07-18 10:00:00', 'status': 'available', 'seats_available': 8, 'economy_price': 1500, 'business_price': 4000}, {'flight_no': 'MU1566', 'origin': '北京', 'destination': '南京', 'depart_time': '2024-07-18 20:00:00', 'arrival_time': '2024-07-18 22:00:00', 'status': 'available', 'seats_available': 8, 'economy_price': 1500, 'business_price': 4000}, {'flight_no': 'CZ1765', 'origin': '南京', 'destination': '深圳', 'depart_time': '2024-07-17 20:30:00', 'arrival_time': '2024-07-17 22:00:00', 'status': 'available', 'seats_available': 8, 'economy_price': 1500, 'business_price': 2500}, {'flight_no': 'CZ1765', 'origin': '南京', 'destination': '深圳', 'depart_time': '2024-07-18 12:30:00', 'arrival_time': '2024-07-18 15:00:00', 'status': 'available', 'seats_available': 8, 'economy_price': 1500, 'business_price': 2500}, {'flight_no': 'MH1765', 'origin': '厦门', 'destination': '成都', 'depart_time': '2024-07-17 12:30:00', 'arrival_time': '2024-07-17 15:00:00', 'status': 'available', 'seats_available': 8, 'economy_price': 1500, 'business_price': 2500}, {'flight_no': 'MH2616', 'origin': '成都', 'destination': '厦门', 'depart_time': '2024-07-18 18:30:00', 'arrival_time': '2024-07-18 21:00:00', 'status': 'available', 'seats_available': 8, 'economy_price': 1500, 'business_price': 2500}, {'flight_no': 'MH2616', 'origin': '成都', 'destination': '福州', 'depart_time': '2024-07-16 18:30:00', 'arrival_time': '2024-07-16 21:00:00', 'status': 'available', 'seats_available': 8, 'economy_price': 1500, 'business_price': 2500}]
        self.reservations = [{'reservation_id': 'res_1', 'user_id': 'user1', 'flight_no': 'CA1234', 'payment_method': 'bank', 'cabin': '经济舱', 'baggage': 1, 'origin': '北京', 'destination': '上海'}, {'reservation_id': 'res_2', 'user_id': 'user1', 'flight_no': 'MU5678', 'payment_method': 'bank', 'cabin': '商务舱', 'baggage': 1, 'origin': '上海', 'destination': '北京'}, {'reservation_id': 'res_3', 'user_id': 'user2', 'flight_no': 'MH1765', 'payment_method': 'bank', 'cabin': '商务舱', 'baggage': 1, 'origin': '厦门', 'destination': '成都'}, {'reservation_id': 'res_4', 'user_id': 'user2', 'flight_no': 'MU2616', 'payment_method': 'bank', 'cabin': '商务舱', 'baggage': 1, 'origin': '成都', 'destination': '厦门'}]

    def _load_scenario(self, scenario: dict, long_context=False) -> None:
        pass

    def get_flight_details(self, origin: str=None, destination: str=None) -> list:
        flights = self.flights
        if origin:
            flights = [flight for flight in flights if flight['origin'] == origin]
        if destination:
            flights = [flight for flight in flights if flight['destination'] == destination]
        if len(flights) == 0:
            return f'没有符合条件的直达航班'
        return [{'flight_no': flight['flight_no'], 'origin': flight['origin'], 'destination': flight['destination'], 'depart_time': flight['depart_time'], 'arrival_time': flight['arrival_time'], 'status': flight['status'], 'seats_available': flight['seats_available'], 'economy_price': flight['economy_price'], 'business_price': flight['business_price']} for flight in flights]

    def get_user_details(self, user_id: str, password: str) -> dict:
        user = self.users.get(user_id)
        if user and user['password'] == password:
            return {key: value for key, value in user.items() if key != 'password'}
        return {'status': 'error', 'message': '用户名或密码不正确'}

    def get_reservation_details(self, reservation_id: str=None, user_id: str=None) -> list:
        if reservation_id:
            reservations = [reservation for reservation in self.reservations if reservation['reservation_id'] == reservation_id]
        elif user_id:
            reservations = [reservation for reservation in self.reservations if reservation['user_id'] == user_id]
        else:
            return {'status': 'error', 'message': '请提供有效的预订ID或用户ID'}
        detailed_reservations = []
        for reservation in reservations:
            flight_info = next((flight for flight in self.flights if flight['flight_no'] == reservation['flight_no']), None)
            detailed_reservation = {**reservation, 'flight_info': flight_info}
            detailed_reservations.append(detailed_reservation)
        return detailed_reservations

    def authenticate_user(self, user_id, password):
        user = self.users.get(user_id)
        if user and user['password'] == password:
            return user
        return {'status': 'error', 'message': '用户名或密码不正确'}

    def get_baggage_allowance(self, membership_level, cabin_class):
        allowance = {'regular': {'经济舱': 1, '商务舱': 2}, 'silver': {'经济舱': 2, '商务舱': 3}, 'gold': {'经济舱': 3, '商务舱': 3}}
        return allowance.get(membership_level, {}).get(cabin_class, 0)

    def find_transfer_flights(self, origin_city, transfer_city, destination_city):
        first_leg_flights = [flight for flight in self.flights if flight['origin'] == origin_city and flight['destination'] == transfer_city and (flight['status'] == 'available')]
        second_leg_flights = [flight for flight in self.flights if flight['origin'] == transfer_city and flight['destination'] == destination_city and (flight['status'] == 'available')]
        transfer_flights = []
        for first_flight in first_leg_flights:
            first_arrival = datetime.strptime(first_flight['arrival_time'], '%Y-%m-%d %H:%M:%S')
            for second_flight in second_leg_flights:
                second_departure = datetime.strptime(second_flight['depart_time'], '%Y-%m-%d %H:%M:%S')
                if first_arrival < second_departure:
                    transfer_flights.append({'first_leg': first_flight, 'second_leg': second_flight})
        if transfer_flights:
            return transfer_flights
        else:
            return '未找到符合条件的中转航班。'

    def calculate_baggage_fee(self, membership_level, cabin_class, baggage_count):
        free_baggage = {'regular': {'经济舱': 1, '商务舱': 2}, 'silver': {'经济舱': 2, '商务舱': 3}, 'gold': {'经济舱': 3, '商务舱': 3}}
        free_limit = free_baggage[membership_level][cabin_class]
        additional_baggage = max(baggage_count - free_limit, 0)
        return additional_baggage * 50

    def update_balance(self, user, payment_method, amount):
        if payment_method == 'cash':
            if user['cash_balance'] + amount < 0:
                return False
            user['cash_balance'] += amount
        elif payment_method == 'bank':
            if user['bank_balance'] + amount < 0:
                return False
            user['bank_balance'] += amount
        return True

    def reserve_flight(self, user_id, password, flight_no, cabin, payment_method, baggage_count):
        user = self.authenticate_user(user_id, password)
        if not user:
            return '认证失败，请检查用户ID和密码。'
        flight = next((f for f in self.flights if f['flight_no'] == flight_no and f['status'] == 'available'), None)
        price = flight['economy_price'] if cabin == '经济舱' else flight['business_price']
        total_cost = price
        baggage_fee = self.calculate_baggage_fee(user['membership_level'], cabin, baggage_count)
        total_cost += baggage_fee
        if payment_method not in ['cash', 'bank']:
            return '支付方式无效'
        if payment_method == 'cash':
            if total_cost > self.users.get(user_id)['cash_balance']:
                return f'cash余额不足，请考虑换一种支付方式'
            self.users.get(user_id)['cash_balance'] -= total_cost
        else:
            if total_cost > self.users.get(user_id)['bank_balance']:
                return f'bank余额不足，请考虑换一种支付方式'
            self.users.get(user_id)['bank_balance'] -= total_cost
        flight['seats_available'] -= 1
        reservation_id = f'res_{len(self.reservations) + 1}'
        reservation = {'reservation_id': reservation_id, 'user_id': user_id, 'flight_no': flight_no, 'payment_method': payment_method, 'cabin': cabin, 'baggage': baggage_count}
        self.reservations.append(reservation)
        return f'预订成功，预订号：{reservation_id}，总费用：{total_cost}元（包含行李费用）。'

    def modify_flight(self, user_id, reservation_id, new_flight_no=None, new_cabin=None, add_baggage=0, new_payment_method=None):
        reservation = next((r for r in self.reservations if r['reservation_id'] == reservation_id and r['user_id'] == user_id), None)
        if not reservation:
            return '预订未找到或用户ID不匹配。'
        current_flight = next((f for f in self.flights if f['flight_no'] == reservation['flight_no']), None)
        if not current_flight:
            return '航班信息未找到。'
        payment_method = new_payment_method if new_payment_method else reservation['payment_method']
        user = self.users[user_id]
        if not user:
            return '用户信息未找到。'
        result_messages = []
        if new_flight_no and new_flight_no != reservation['flight_no']:
            new_flight = next((f for f in self.flights if f['flight_no'] == new_flight_no), None)
            if new_flight and new_flight['origin'] == current_flight['origin'] and (new_flight['destination'] == current_flight['destination']):
                reservation['flight_no'] = new_flight_no
                result_messages.append('航班号已更改。')
            else:
                return f'航班更改失败：新的航班号无效或目的地不匹配。'
        if new_cabin and new_cabin != reservation.get('cabin'):
            price_difference = self.calculate_price_difference(current_flight, reservation['cabin'], new_cabin)
            reservation['cabin'] = new_cabin
            if price_difference > 0:
                if self.update_balance(user, payment_method, -price_difference):
                    result_messages.append(f'舱位更改成功。已支付差价: {price_difference}。')
                else:
                    result_messages.append('余额不足，无法支付舱位差价。')
            elif price_difference < 0:
                self.update_balance(user, payment_method, -price_difference)
                result_messages.append(f'舱位更改成功。已退款差价: {-price_difference}。')
        if add_baggage > 0:
            membership = user['membership_level']
            max_free_baggage = self.get_baggage_allowance(membership, reservation['cabin'])
            current_baggage = reservation.get('baggage', 0)
            total_baggage = current_baggage + add_baggage
            extra_baggage = max(0, total_baggage - max_free_baggage)
            baggage_cost = extra_baggage * 50
            if baggage_cost > 0:
                if self.update_balance(user, payment_method, -baggage_cost):
                    result_messages.append(f'行李已增加。需支付额外费用: {baggage_cost}。')
                else:
                    result_messages.append('余额不足，无法支付额外行李费用。')
            reservation['baggage'] = total_baggage
        if not result_messages:
            result_messages.append('修改完成，无需额外费用。')
        return ' '.join(result_messages)

    def cancel_reservation(self, user_id, reservation_id, reason):
        current_time = datetime(2024, 7, 14, 6, 0, 0)
        user = self.users.get(user_id, None)
        if not user:
            return '用户ID无效。'
        reservation = next((r for r in self.reservations if r['reservation_id'] == reservation_id and r['user_id'] == user_id), None)
        if not reservation:
            return '预订ID无效或与该用户无关。'
        flight = next((f for f in self.flights if f['flight_no'] == reservation['flight_no']), None)
        if not flight:
            return '航班信息无效。'
        depart_time = datetime.strptime(flight['depart_time'], '%Y-%m-%d %H:%M:%S')
        if current_time > depart_time:
            return '航段已使用，无法取消。'
        time_until_departure = depart_time - current_time
        cancel_fee = 0
        refund_amount = 0
        flight_price = flight['economy_price'] if reservation['cabin'] == '经济舱' else flight['business_price']
        if reason == '航空公司取消航班':
            refund_amount = flight_price
            self.process_refund(user, refund_amount)
            return f'航班已取消，您的预订将被免费取消，已退款{refund_amount}元。'
        elif time_until_departure > timedelta(days=1):
            refund_amount = flight_price
            self.process_refund(user, refund_amount)
            return f'距离出发时间超过24小时，免费取消成功，已退款{refund_amount}元。'
        else:
            cancel_fee = flight_price * 0.1
            refund_amount = flight_price - cancel_fee
            self.process_refund(user, refund_amount)
            return f'距离出发时间不足24小时，已扣除取消费{cancel_fee}元，退款{refund_amount}元。'

    def process_refund(self, user, amount):
        user['cash_balance'] += amount
        print(f"已成功处理退款，{user['user_name']}的现金余额增加了{amount}元。")

    def calculate_price_difference(self, flight, old_cabin, new_cabin):
        cabin_prices = {'经济舱': flight['economy_price'], '商务舱': flight['business_price']}
        old_price = cabin_prices.get(old_cabin, 0)
        new_price = cabin_prices.get(new_cabin, 0)
        return new_price - old_price
